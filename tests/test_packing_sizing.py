"""S1, S4: the dry run and the pilot size packed rows (data.packing) with the loop's own code.

A microbatch of m examples packs into at most m rows, none wider than the widest row the
epoch packs: the dry run sizes m rows of that width, measured by packing the first epoch's
microbatches exactly as the loop's `collate` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot_support import one_torch_thread  # noqa: F401  (a fixture)
from sizing_support import tiny_llama_campaign
from tunepilot.data.workspace import Workspace

torch = pytest.importorskip("torch")

PACKED = ["data.packing=true", "data.max_length=512"]


@pytest.fixture(scope="module")
def llama_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_campaign(tmp_path_factory.mktemp("packed-dry"))


def _epoch_widths(ws: Workspace) -> list[tuple[int, int]]:
    """(rows, width) of every microbatch of the first epoch, through the loop's collate."""
    from tunepilot.train.batching import UpdateSampler, collate
    from tunepilot.train.packing import packing_of

    prepared = ws.prepare(write=False, seal=False)
    encoder = ws.encoder(prepared.label_names).training_view()
    train = [encoder.encode(e) for e in prepared.splits["train"]]
    t = ws.campaign.training
    sampler = UpdateSampler([len(e.input_ids) for e in train], t.microbatch, 1, seed=t.seed,
                            bucket_by_length=t.bucket_by_length)  # fmt: skip
    out = []
    for i in range(sampler.plan.updates_per_epoch):
        for mb in sampler.global_update(0, i):
            batch = collate([train[j] for j in mb], "causal_lm", 0, packing_of(ws.campaign))
            out.append(tuple(batch["input_ids"].shape))
    return out


def test_s1_dry_run_sizes_packed_rows_at_the_widest_row_the_loop_packs(llama_campaign) -> None:
    from tunepilot.sizing.dry_run.config import architecture_config
    from tunepilot.sizing.dry_run.shape import Shape

    ws = Workspace.open(llama_campaign, PACKED)
    arch = architecture_config(ws.campaign.model, ws.root)
    shape = Shape.from_campaign(ws, arch, microbatch=None, max_length=None,
                                activation_checkpointing=None, base_dtype="fp32",
                                attention=None, device="cpu")  # fmt: skip
    widths = _epoch_widths(ws)
    assert shape.length == max(w for _, w in widths) <= 512
    assert all(rows <= shape.microbatch for rows, _ in widths)  # m examples, <= m rows
    assert shape.lengths is not None and shape.length > shape.lengths.longest_train  # packed
    assert any("data.packing" in n for n in shape.notes)
    padded = Shape.from_campaign(Workspace.open(llama_campaign, ["data.max_length=512"]), arch,
                                 microbatch=None, max_length=None, activation_checkpointing=None,
                                 base_dtype="fp32", attention=None, device="cpu")  # fmt: skip
    assert padded.length == padded.lengths.longest_train  # unpacked: the longest example


def test_s4_dry_run_steps_are_sized_at_the_packed_shape(llama_campaign) -> None:
    from tunepilot.sizing.dry_run.run import dry_run

    ws = Workspace.open(llama_campaign, PACKED)
    result = dry_run(ws, base_dtype="fp32")
    widest = max(w for _, w in _epoch_widths(ws))
    assert result.phase("first step").inputs["length"] == widest
    assert result.phase("first step").inputs["microbatch"] == ws.campaign.training.microbatch


@pytest.mark.usefixtures("one_torch_thread")
def test_s4_the_pilot_steps_and_audits_packed_rows(llama_campaign) -> None:
    from tunepilot.pilot.flow import GATES, new_pilot_folder, new_state
    from tunepilot.pilot.phases import run_gate

    ws = Workspace.open(llama_campaign, PACKED)
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=False, hooks=None)
    rows = {}
    for gate in GATES:
        rows[gate.name] = run_gate(state, gate, rows)
        if gate.name == "first step":
            break
    assert state.packing is not None and state.packing.attention == "sdpa"
    assert rows["update audit"].verdict == "PASS", rows["update audit"].sentence
    first = rows["first step"]
    assert first.verdict == "PASS", first.sentence
    # the longest examples, packed: m examples in at most m rows of at most 512 tokens
    assert first.inputs["rows"] <= first.inputs["microbatch"] == 2
    assert first.inputs["length"] <= 512
