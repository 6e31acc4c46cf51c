"""D3, D5, S2: `data show --batch` shows the microbatch a run's first forward receives, padded
or packed, and the dossier shows the same file escaped; packing a classifier is bad input.

Each CLI call costs a few seconds of imports: every test makes one call and asserts what it
shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunepilot.demo.campaign import write_demo_campaign
from tunepilot.tasks.base import IGNORE_INDEX

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]
ENV = {**os.environ, "COLUMNS": "250"}


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([*TUNEPILOT, *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def ext_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extraction demo on a tiny Llama (microbatch 2), answers carrying the loss."""
    return write_demo_campaign(tmp_path_factory.mktemp("ext"), "extraction", tiny=True,
                               n_conversations=30, overrides={"data.max_length": 256})  # fmt: skip


def _training_view(campaign: Path, packing: bool) -> tuple[list, list]:
    """The training split as a run encodes it, and the first microbatch the loop draws: the
    truth the CLI is checked against, built with the library, not the CLI."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.train.batching import UpdateSampler

    ws = Workspace.open(campaign, [f"data.packing={str(packing).lower()}"])
    prepared = ws.prepare(write=False, seal=False)
    train = [ws.encoder(prepared.label_names).training_view().encode(e)
             for e in prepared.splits["train"]]  # fmt: skip
    t = ws.campaign.training
    sampler = UpdateSampler([len(e.input_ids) for e in train], t.microbatch, t.accumulation,
                            seed=t.seed, bucket_by_length=t.bucket_by_length)  # fmt: skip
    return train, [train[i] for i in sampler.next_update().microbatches[0]]


def test_d3_d5_batch_json_is_the_packed_microbatch_with_its_boundaries(ext_campaign) -> None:
    result = cli("data", "show", ext_campaign, "--batch", "--json", "data.packing=true")
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)  # one JSON document, nothing else on stdout
    _, first = _training_view(ext_campaign, packing=True)
    assert view["layout"] == "packed" and view["packing"]["row_length"] == 256
    assert view["examples"] == [e.example_id for e in first]
    assert view["tensors"]["attention_mask"][1] == 1  # the 4D block mask
    spans = [x for row in view["rows"] for x in row["examples"]]
    assert sorted(x["id"] for x in spans) == sorted(e.example_id for e in first)
    by_id = {e.example_id: e for e in first}
    for row in view["rows"]:
        for x in row["examples"]:
            e, toks = by_id[x["id"]], row["tokens"][x["start"] : x["end"]]
            assert [t["id"] for t in toks] == e.input_ids
            assert [t["position"] for t in toks] == list(range(len(e.input_ids)))
            assert toks[0]["label"] is None  # never predicted from the previous example
            assert [t["label"] for t in toks[1:]] == [None if v == IGNORE_INDEX else v
                                                      for v in e.labels[1:]]  # fmt: skip
    # S2: the positions with loss are the unpacked microbatch's own target count
    assert view["loss_targets"] == sum(r["loss_positions"] for r in view["rows"])
    assert view["loss_targets"] == sum(sum(v != IGNORE_INDEX for v in e.labels[1:])
                                       for e in first)  # fmt: skip
    saved = ext_campaign.parent / "data" / view["version"] / "batch.json"
    assert json.loads(saved.read_text()) == view  # what the dossier reads


def test_d3_batch_text_shows_padding_mask_and_ignored_labels_per_row(ext_campaign) -> None:
    result = cli("data", "show", ext_campaign, "--batch")
    assert result.returncode == 0, result.stderr
    _, first = _training_view(ext_campaign, packing=False)
    out = result.stdout
    assert "padded" in out and "attention_mask 2x" in out
    for r, e in enumerate(first):
        assert f"row {r}: {e.example_id} [0:{len(e.input_ids)})" in out
    assert "label ·: ignored" in out and "mask: the attention mask (0: padding)" in out


def test_d3_packing_a_classifier_exits_2_naming_data_packing(tmp_path) -> None:
    campaign = write_demo_campaign(tmp_path, tiny=True, n_conversations=20)
    result = cli("validate", campaign, "data.packing=true")
    assert result.returncode == 2
    assert "data.packing: true" in result.stderr and "set data.packing: false" in result.stderr
    assert "Traceback" not in result.stderr


def test_d3_the_dossier_shows_batch_json_escaped_and_capped(tmp_path) -> None:
    from tunepilot.report.batch import POSITIONS_SHOWN, batch_html, read_batch

    token = {"id": 1, "token": "<script>alert(1)</script>", "attention": 1, "example": 0,
             "position": 0, "label": None, "loss": False}  # fmt: skip
    view = {"layout": "packed", "packing": {"row_length": 8, "attention": "<b>sdpa</b>"},
            "tensors": {"input_ids": [1, 600]}, "loss_targets": 3, "microbatches_in_update": 2,
            "rows": [{"examples": [{"id": "<img src=http://x>", "start": 0, "end": 600}],
                      "padding": 0, "loss_positions": 3, "tokens": [token] * 600},
                     "not a row"]}  # fmt: skip
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(view))
    shown = read_batch(path)
    assert shown is not None and len(shown["rows"]) == 1
    assert len(shown["rows"][0]["tokens"]) == POSITIONS_SHOWN
    html = batch_html(shown, "tunepilot data show c.yaml --batch")
    assert "<script>" not in html and "<img" not in html and "<b>sdpa" not in html
    assert "&lt;script&gt;" in html and "88 more position(s) in batch.json" in html
    path.write_text("[1, 2]")
    assert "Missing" in batch_html(read_batch(path), "tunepilot data show c.yaml --batch")
