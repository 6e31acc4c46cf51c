"""The bundle's README as the Hub reads it (R3, P4), for a base that comes from the
Hub: base_model is the repo id and base_model_revision its commit, the metadata block passes
huggingface_hub's own parsing and validation offline, the snippet names the bundle once, and a
full fine-tune's card does not call itself an adapter.

The Hub base is the tiny Llama placed in a Hugging Face cache layout (models--org--name with a
snapshot per commit) and read with HF_HUB_OFFLINE=1, as a machine that fetched it earlier would.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from test_export import train_run, write_campaign

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "tiny-org/tiny-llama"


def _hub_campaign(root: Path, cache: Path, method: str) -> Path:
    """test_export's extraction campaign with its base moved into a Hub cache as REPO."""
    campaign = write_campaign(root, "extraction", method)
    snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    shutil.copytree(root / "base-model", snapshot, ignore=shutil.ignore_patterns(".git"))
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(COMMIT)
    shutil.rmtree(root / "base-model")
    spec = yaml.safe_load(campaign.read_text())
    spec["model"] |= {"name_or_path": REPO, "revision": COMMIT}
    campaign.write_text(yaml.safe_dump(spec, sort_keys=False))
    return campaign


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read at each call
    return cache


def test_p4_r3_a_hub_base_card_names_the_repo_and_commit_and_validates_offline(
    tmp_path: Path, hub_cache: Path
) -> None:
    from huggingface_hub import ModelCard, ModelCardData
    from huggingface_hub.repocard_data import model_index_to_eval_results

    from tunepilot.deliver.export import export_run

    ws, run_id = train_run(_hub_campaign(tmp_path / "camp", hub_cache, "lora"))
    bundle = export_run(ws, run_id)
    card = ModelCard.load(bundle / "README.md", ignore_metadata_errors=False)
    meta = card.data.to_dict()
    assert (meta["base_model"], meta["base_model_revision"]) == (REPO, COMMIT)
    assert (meta["library_name"], meta["pipeline_tag"]) == ("peft", "text-generation")
    assert {"tunepilot", "extraction", "lora"} <= set(meta["tags"])
    ModelCardData(**meta, ignore_metadata_errors=False)  # the Hub's own field checks, again
    name, results = model_index_to_eval_results(meta["model-index"])
    assert name == f"tiny-extraction-{run_id}" and results
    headline = results[0]
    assert "95% CI " in headline.metric_name and headline.dataset_split == "validation"
    body = card.text
    assert f"base = AutoModelForCausalLM.from_pretrained({REPO!r}, revision={COMMIT!r}" in body
    assert "PeftModel.from_pretrained(base, bundle)" in body
    assert "The adapter only works on that exact base" in body
    assert str(tmp_path / "camp" / "base-model") not in card.content


def test_r3_a_full_fine_tune_card_is_a_transformers_model_not_an_adapter(
    tmp_path: Path, hub_cache: Path
) -> None:
    from huggingface_hub import ModelCard

    from tunepilot.deliver.export import export_run

    ws, run_id = train_run(_hub_campaign(tmp_path / "camp", hub_cache, "full"))
    card = ModelCard.load(export_run(ws, run_id) / "README.md", ignore_metadata_errors=False)
    assert (card.data.library_name, card.data.base_model) == ("transformers", REPO)
    assert "lora" not in card.data.tags and "adapter" not in card.text.split("## Check it")[0]
    assert "This is a full fine-tune of that base" in card.text
    assert "AutoModelForCausalLM.from_pretrained(bundle)" in card.text
    assert "one example moves a per-example rate (exact match) by" in card.text  # no accuracy
