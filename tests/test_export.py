"""P4, R3: `export_run` writes a bundle a colleague can use without tunepilot.

A tiny campaign (tiny BERT or tiny Llama as a git-versioned local base, a few dozen generated
examples) is trained for 2 updates through the real runner, then exported. These tests read
the bundle's files; whether plain transformers + peft reproduce the model is test_verify.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tunepilot.errors import InputError

pytest.importorskip("peft")

PRODUCTS = ["kettle", "laptop stand", "blue lamp", "desk chair", "phone case", "coffee mill"]
QUEUES = {
    "shipping": "where is my order {n}, the {p} has not arrived",
    "billing": "I was charged twice for the {p}, please refund order {n}",
    "returns": "the {p} from order {n} is broken, I want to return it",
}


def git_commit_all(folder: Path, message: str) -> str:
    """Make `folder` a git clone-like base (its own work tree) and return the new HEAD."""
    run = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    if not (folder / ".git").exists():
        subprocess.run([*run[:3], "init", "-q"], check=True)
    subprocess.run([*run, "add", "-A"], check=True)
    subprocess.run([*run, "commit", "-q", "--allow-empty", "-m", message], check=True)
    return subprocess.run(
        [*run[:3], "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def write_campaign(root: Path, task: str, method: str = "lora") -> Path:
    """A campaign folder with a git-versioned tiny base and 48 generated examples."""
    from tunepilot.model.tiny import build_tiny_bert, build_tiny_llama

    root.mkdir(parents=True, exist_ok=True)
    base = root / "base-model"
    (build_tiny_bert if task == "classification" else build_tiny_llama)(base)
    git_commit_all(base, "base")
    rows = []
    for i in range(48):
        queue = sorted(QUEUES)[i % 3]
        product, number = PRODUCTS[i % len(PRODUCTS)], f"{10000 + 37 * i}"
        rows.append(
            {
                "id": f"t{i:03d}",
                "text": QUEUES[queue].format(n=number, p=product),
                "queue": queue,
                "fields": {"order_id": number, "product": product},
            }
        )
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    classification = task == "classification"
    campaign: dict[str, Any] = {
        "name": f"tiny-{task}",
        "hypothesis": {"behaviour": "Route or read support messages.", "task": task}
        | ({} if classification else {"required_fields": ["order_id", "product"]}),
        "model": {
            "name_or_path": "base-model",
            "method": method,
            "lora": {
                "r": 4,
                "alpha": 8,
                "target_modules": ["query", "value"] if classification else ["q_proj", "v_proj"],
                "modules_to_save": ["classifier"] if classification else [],
            },
        },
        "data": {
            "file": "data.jsonl",
            "fields": {"id": "id", "text": "text"}
            | ({"label": "queue"} if classification else {"target": "fields"}),
            "split": {"policy": "random", "validation": 0.25, "test": 0.1},
            "max_length": 64,
            "template": "Message: {text}\nJSON: ",
        },
        "training": {
            "microbatch": 4,
            "accumulation": 1,
            "budget": {"updates": 2},
            "lr": 0.01,
            "scheduler": "constant",
            "eval_every": 100,
            "eval_batch_size": 8,
            "max_new_tokens": 6,
            "seed": 0,
        },
    }
    path = root / "campaign.yaml"
    path.write_text(yaml.safe_dump(campaign, sort_keys=False))
    return path


def train_run(campaign_file: Path, stop_after: int | None = None) -> tuple[Any, str]:
    """Open the workspace and train the control for 2 updates; returns (workspace, run id)."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments.runner import Session, execute_run
    from tunepilot.ledger import Ledger

    ws = Workspace.open(campaign_file)
    with Ledger.open(ws.ledger_path) as ledger:
        outcome = execute_run(
            Session(ws), ledger, "control", 0, stop_after=stop_after, progress=False
        )
    return ws, outcome.run_id


def export_fresh(tmp_path_factory: pytest.TempPathFactory, task: str, method: str = "lora"):
    from tunepilot.deliver.export import export_run

    root = tmp_path_factory.mktemp(f"{task}-{method}")
    ws, run_id = train_run(write_campaign(root, task, method))
    return ws, run_id, export_run(ws, run_id)


@pytest.fixture(scope="module")
def classification_export(tmp_path_factory: pytest.TempPathFactory):
    return export_fresh(tmp_path_factory, "classification")


def test_p4_r3_adapter_bundle_holds_every_promised_file(classification_export) -> None:
    ws, run_id, bundle = classification_export
    assert bundle == ws.exports_dir / run_id
    names = {p.name for p in bundle.iterdir()}
    promised = {
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "campaign.resolved.yaml",
        "base.json",
        "env.json",
        "bundle.json",
        "metrics.json",
        "control.json",
        "run.json",
        "README.md",
        "MANIFEST.json",
    }
    assert promised <= names, promised - names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pkl", ".pth"))]
    assert not list(ws.exports_dir.glob(".tmp-*")), "the temporary folder was left behind"
    manifest = json.loads((bundle / "MANIFEST.json").read_text())["files"]
    assert set(manifest) == names - {"MANIFEST.json"}
    from tunepilot.model.base import sha256_file

    for name, entry in manifest.items():
        assert entry["sha256"] == sha256_file(bundle / name)
        assert entry["bytes"] == (bundle / name).stat().st_size


def test_p4_adapter_config_names_the_base_and_its_exact_commit(classification_export) -> None:
    ws, _, bundle = classification_export
    source = ws.model_source
    head = subprocess.run(
        ["git", "-C", str(source.path), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    config = json.loads((bundle / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == source.name == str(source.path)
    assert config["revision"] == head
    assert "classifier" in config["modules_to_save"]  # the new head travels in the adapter
    base = json.loads((bundle / "base.json").read_text())
    assert base["resolved_commit"] == head and base["kind"] == "local"
    assert base["weight_files"] == source.weight_files
    assert set(base["weight_files"]) == {"model.safetensors"}


def test_r3_bundle_records_campaign_metrics_data_version_and_env(classification_export) -> None:
    ws, run_id, bundle = classification_export
    resolved = yaml.safe_load((bundle / "campaign.resolved.yaml").read_text())
    assert resolved["name"] == ws.campaign.name and resolved["_export"]["run_id"] == run_id
    assert resolved["training"]["seed"] == 0
    spec = json.loads((bundle / "bundle.json").read_text())
    run = json.loads((bundle / "run.json").read_text())
    assert spec["data_version"] == run["data_version"] == run["data_version_at_export"]
    assert spec["weights"] == "adapter" and spec["labels"] == ["billing", "returns", "shipping"]
    assert run["checkpoint"] == "step-000002" and run["status"] == "completed"
    metrics = json.loads((bundle / "metrics.json").read_text())["metrics"]
    assert 0.0 <= metrics["final_validation"]["accuracy"] <= 1.0
    assert [e["update"] for e in metrics["evaluations"]] == [2]
    env = json.loads((bundle / "env.json").read_text())
    assert env["packages"]["peft"] and env["packages"]["transformers"]


def test_r2_controls_are_the_in_memory_models_outputs(classification_export) -> None:
    _, _, bundle = classification_export
    controls = json.loads((bundle / "control.json").read_text())
    inputs = controls["inputs"]
    assert len(inputs) == 8 and len({c["id"] for c in inputs}) == 8
    assert {c["gold_label"] for c in inputs} == {"billing", "returns", "shipping"}
    for c in inputs:
        assert len(c["logits"]) == 3 and c["input_ids"][0] != c["input_ids"][-1]
        best = max(range(3), key=lambda i: c["logits"][i])
        assert c["expected_label"] == controls["labels"][best]


def test_r3_readme_has_the_plain_load_snippet_and_the_labels(classification_export) -> None:
    _, _, bundle = classification_export
    readme = (bundle / "README.md").read_text()
    assert "AutoModelForSequenceClassification.from_pretrained(" in readme
    assert f"bundle = {bundle.name!r}  # this folder, or its Hub repo id once pushed" in readme
    assert "PeftModel.from_pretrained(base, bundle)" in readme
    assert "0: billing, 1: returns, 2: shipping" in readme
    assert "tunepilot verify" in readme
    assert "import tunepilot" not in readme


def test_r3_readme_is_a_hub_model_card_huggingface_hub_parses_offline(
    classification_export,
) -> None:
    """The metadata block goes through huggingface_hub's own parser (ModelCard.load builds a
    ModelCardData and turns model-index into EvalResults, raising on a malformed one)."""
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    from tunepilot.ledger import Ledger

    ws, run_id, bundle = classification_export
    card = ModelCard.load(bundle / "README.md", ignore_metadata_errors=False)
    data = card.data
    assert data.library_name == "peft" and data.pipeline_tag == "text-classification"
    assert {"tunepilot", "classification", "lora"} <= set(data.tags)
    base = json.loads((bundle / "base.json").read_text())
    assert data.base_model is None  # a local folder is not a Hub id; its revision still is
    assert data.to_dict()["base_model_revision"] == base["resolved_commit"]
    with Ledger.open(ws.ledger_path) as ledger:
        evaluation = [e for e in ledger.evaluations(run_id=run_id) if e.split == "validation"][-1]
        n = len(ledger.predictions(evaluation.id))
    name, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    assert name == f"tiny-classification-{run_id}"
    by_metric = {r.metric_type: r for r in results}
    for metric in ("macro_f1", "accuracy"):
        result = by_metric[metric]
        assert result.metric_value == pytest.approx(evaluation.metrics[metric], abs=1e-6)
        assert result.dataset_split == "validation"
        assert result.dataset_revision == evaluation.data_version
        low, high = map(float, result.metric_name.split("95% CI ")[1].split(",")[0].split("-"))
        assert low <= result.metric_value <= high and f"n={n}" in result.metric_name
    body = card.text
    assert "## Observed limits" in body and f"validation split has {n} examples" in body
    assert "PeftModel.from_pretrained(base, " in body  # the load snippet survives the card


def test_r3_export_refuses_to_overwrite_an_existing_export(classification_export) -> None:
    from tunepilot.deliver.export import export_run

    ws, run_id, bundle = classification_export
    before = (bundle / "MANIFEST.json").read_bytes()
    with pytest.raises(InputError) as err:
        export_run(ws, run_id)
    assert "--out" in str(err.value) and str(bundle) in str(err.value)
    assert (bundle / "MANIFEST.json").read_bytes() == before


def test_r3_export_refuses_a_run_that_did_not_complete(tmp_path: Path) -> None:
    from tunepilot.deliver.export import export_run

    ws, run_id = train_run(write_campaign(tmp_path, "classification"), stop_after=1)
    with pytest.raises(InputError) as err:
        export_run(ws, run_id)
    assert "interrupted" in str(err.value) and "tunepilot resume" in str(err.value)
    assert not (ws.exports_dir / run_id).exists()


def test_r2_controls_are_chosen_deterministically_across_labels() -> None:
    from tunepilot.deliver.controls import choose_controls
    from tunepilot.tasks.example import Example

    examples = [
        Example(id=f"e{i}", text="x", source="f:1", label="ab"[i % 5 == 0]) for i in range(40)
    ]
    first = choose_controls(examples)
    assert [e.id for e in first] == [e.id for e in choose_controls(list(reversed(examples)))]
    assert len(first) == 8 and sum(e.label == "b" for e in first) == 4


def test_r3_every_bundle_file_has_a_plain_files_mode(classification_export) -> None:
    """safetensors writes 0600; a bundle handed to a colleague is readable like its README."""
    import os

    _, _, bundle = classification_export
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in bundle.rglob("*") if p.is_file()}
    assert "adapter_model.safetensors" in modes
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_r3_export_out_is_inside_the_campaign_and_the_dossier_lists_it(
    classification_export, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tunepilot.deliver.flow import export_command
    from tunepilot.report.collect import collect

    ws, run_id, _ = classification_export
    monkeypatch.chdir(tmp_path)  # the shell's folder is not where a relative --out lands
    assert export_command(ws, run_id, Path("handover/bundle"), as_json=True) in (0, 1)
    assert (ws.root / "handover" / "bundle" / "MANIFEST.json").is_file()
    assert not (tmp_path / "handover").exists()
    elsewhere = tmp_path / "outside-bundle"
    assert export_command(ws, run_id, elsewhere, as_json=True) in (0, 1)
    listed = {x["folder"]: x for x in collect(ws)["exports"]}
    inside = listed[str((ws.root / "handover" / "bundle").resolve())]
    assert inside["n_files"] > 0 and inside["pin"] and inside["run_id"] == run_id
    outside = listed[str(elsewhere.resolve())]
    assert outside["outside"] and outside["pin"] and outside["n_files"] == 0  # never read


def test_s4_s5_a_run_records_its_memory_in_every_phase_with_the_pilots_probe(
    classification_export,
) -> None:
    """runs/<id>/memory/rank-0.jsonl: loading, the first update (optimizer state), a steady
    update, the first evaluation and checkpoint, each through the one memory probe."""
    from tunepilot.measure.phase_log import read_phase_rows

    ws, run_id, _ = classification_export
    rows = read_phase_rows(ws.runs_dir / run_id)
    assert sorted(r["phase"] for r in rows) == sorted(
        ["load", "first update", "steady update", "evaluation", "checkpoint"])
    first = next(r for r in rows if r["phase"] == "first update")
    assert (first["rank"], first["world_size"], first["update"]) == (0, 1, 1)
    assert all(r["completed"] and r["counters"] == ["rss"] for r in rows)
    assert all(r["readings"][0]["peak_bytes"] >= r["readings"][0]["baseline_bytes"] for r in rows)
