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


BASE_CARD = "---\nlicense: apache-2.0\nlanguage:\n- en\ntags: [tiny]\n---\n\n# tiny llama\n"


def test_l5_h4_a_card_published_as_is_carries_license_data_hyperparameters_the_sealed_test_and_no_machine_path(  # noqa: E501
    tmp_path: Path, hub_cache: Path
) -> None:
    """Everything the Hub's card template asks that the campaign knows, validated by
    huggingface_hub's own classes offline: license from the base's card, the declared
    language and Hub dataset, the data's real name and files with the data version, the
    hyperparameters and training procedure, validation and sealed-test metrics with
    intervals, framework versions, base + revision; and no path of this machine."""
    import hashlib
    import importlib.metadata

    from huggingface_hub import ModelCard, ModelCardData
    from huggingface_hub.repocard import metadata_load
    from huggingface_hub.repocard_data import model_index_to_eval_results

    from tunepilot.deliver.export import export_run
    from tunepilot.experiments.sealed_test import final_test

    root = tmp_path / "camp"
    campaign = _hub_campaign(root, hub_cache, "lora")
    snapshot = next(hub_cache.glob("models--*/snapshots/*"))
    (snapshot / "README.md").write_text(BASE_CARD)
    (root / "support-tickets").mkdir()
    (root / "data.jsonl").rename(root / "support-tickets" / "data.jsonl")
    spec = yaml.safe_load(campaign.read_text())
    spec["data"]["file"] = "support-tickets/data.jsonl"
    spec["card"] = {"language": ["en", "pt"], "datasets": ["tiny-org/support-tickets"]}
    campaign.write_text(yaml.safe_dump(spec, sort_keys=False))
    ws, run_id = train_run(campaign)
    assert final_test(ws, run_id, as_json=True) == 0  # look 1 at the sealed test (H4)
    bundle = export_run(ws, run_id)
    readme = (bundle / "README.md").read_text(encoding="utf-8")

    card = ModelCard.load(bundle / "README.md", ignore_metadata_errors=False)
    meta = card.data.to_dict()
    assert meta == metadata_load(bundle / "README.md")
    ModelCardData(**meta, ignore_metadata_errors=False)
    assert (meta["license"], meta["language"]) == ("apache-2.0", ["en", "pt"])
    assert meta["datasets"] == ["tiny-org/support-tickets"]
    assert (meta["base_model"], meta["base_model_revision"]) == (REPO, COMMIT)
    _, results = model_index_to_eval_results(meta["model-index"])
    by_split = {r.dataset_split for r in results}
    assert by_split == {"validation", "test"}
    test_headline = next(r for r in results if r.dataset_split == "test")
    assert "95% CI " in test_headline.metric_name
    assert test_headline.dataset_type == "support-tickets"
    assert all(r.dataset_revision == meta["tunepilot_data_version"] for r in results)

    body = card.text
    data_file = root / "support-tickets" / "data.jsonl"
    digest = hashlib.sha256(data_file.read_bytes()).hexdigest()
    for words in ("**Dataset**: support-tickets (Hub: tiny-org/support-tickets)",
                  "`support-tickets/data.jsonl`", digest, meta["tunepilot_data_version"],
                  "## Training procedure", "### Training hyperparameters", "- learning_rate: 0.01",
                  "- total_train_batch_size: 4", "- training_steps: 2", "- lora_r: 4",
                  "### Sealed test (H4)", "Look 1 of 1 at the sealed test split",
                  "**License**: apache-2.0 (the base model's card)",
                  "**Language**: en, pt (declared in the campaign (card.language))",
                  f"- PEFT {importlib.metadata.version('peft')}",
                  f"- Transformers {importlib.metadata.version('transformers')}",
                  "## Comparison (the campaign's decision, L5)"):  # fmt: skip
        assert words in body, words
    assert "train (validation)" not in readme and "dataset: train" not in readme
    for machine in (str(tmp_path), str(Path.home()), "/tmp/"):
        assert machine not in readme, machine
    assert str(tmp_path) not in (bundle / "comparison.json").read_text(encoding="utf-8")


def test_l5_every_user_string_in_the_card_renders_as_text_never_as_html_an_image_or_a_link() -> None:  # noqa: E501
    """The card through markdown-it-py with HTML on (as the Hub renders it): class names, the
    behaviour, the dataset and file names, module names, audit sentences and the decision,
    each a payload, yield no HTML, image or link token, and a template cannot close its fence."""
    from markdown_it import MarkdownIt

    from tunepilot.campaign import Campaign
    from tunepilot.deliver.card import model_card
    from tunepilot.deliver.card_facts import CardFacts
    from tunepilot.model.base import ModelSource

    payload = ('<img src="http://127.0.0.1:9/x.png"> ![t](http://127.0.0.1:9/y.png) '
               "[c](javascript:x)")
    campaign = Campaign.model_validate({
        "name": "c", "hypothesis": {"behaviour": f"# {payload}\n<script>alert(1)</script>",
                                    "task": "extraction", "required_fields": ["a"]},
        "model": {"name_or_path": f"models/{payload}", "lora": {"target_modules": [payload]}},
        "data": {"file": "d.jsonl", "fields": {"target": "t"},
                 "template": "```\n</code><img src=x>\n```{text}"},
        "card": {"dataset_name": payload, "license": "mit"},
    })  # fmt: skip
    source = ModelSource(Path("/somewhere/models/x"), "/somewhere/models/x", None, None,
                         {f"{payload}.safetensors": "ab"}, "local")  # fmt: skip
    spec = {"campaign": "c", "run_id": "control-s0-1", "task": "extraction",
            "behaviour": campaign.hypothesis.behaviour, "model_kind": "causal_lm",
            "weights": "adapter", "method": "lora", "labels": None, "data_version": "v-1",
            "template": campaign.data.template, "chat": None, "tunepilot_version": "0",
            "merged": None,
            "load": {"auto_class": "AutoModelForCausalLM", "config": {}}}  # fmt: skip
    facts = CardFacts(
        data={"name": payload, "hub_ids": [], "version": "v-1", "counts": {"train": 3},
              "policy": {"policy": "random"}, "cleaning": 0,
              "files": [{"split": "file", "path": f"{payload}/d.jsonl"}]},
        comparison={"format": "x", "run_id": "r", "variant": "control", "seed": 0,
                    "level": 0.95, "metric": "m", "chosen": True, "vs_control": None,
                    "vs_baseline": {"interval": None, "why": payload}, "seeds": {},
                    "decision": {"id": 1, "evidence_sha256": "0" * 64, "decision": payload}},
    )  # fmt: skip
    audit = {"findings": [{"verdict": "WARN", "check": payload, "sentence": payload}]}
    card = model_card(spec, source, "control-s0-1", {"fails_guards": [payload]},
                      {"inputs": []}, [], audit, campaign, {}, facts)  # fmt: skip
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    page = card.split("\n---\n", 1)[1]
    seen = [t for tok in md.parse(page) for t in [tok, *(tok.children or [])]]
    kinds = {t.type for t in seen}
    assert not kinds & {"html_inline", "html_block", "image", "link_open"}, kinds
    html = md.render(page)
    assert "<img" not in html and "<script" not in html and "<a " not in html
    assert html.count("&lt;img") >= 8  # each payload is shown, as text
    assert "/somewhere" not in card
