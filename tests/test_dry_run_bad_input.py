"""Bad input to the dry run (S1, L1): a config.json that is not one, an architecture or a shape
transformers refuses, a sequence longer than the model, a catalog that is not one; each is an
InputError naming the file (exit 2 with one JSON document under --json), never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunepilot.campaign import ModelSettings
from tunepilot.errors import InputError
from tunepilot.sizing.dry_run.config import architecture_config, shipped_configs

LLAMA_8B = json.loads(shipped_configs()["llama-3-8b-config"].read_text(encoding="utf-8"))
PRINTABLE = {k: v for k, v in LLAMA_8B.items() if not k.startswith("_")}


def _refusal(tmp_path: Path, text: str | bytes) -> InputError:
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError) as caught:
        architecture_config(ModelSettings(name_or_path=str(folder)), tmp_path)
    where = " ".join(p.where for p in caught.value.problems)
    assert str(path) in where, caught.value  # the file is named
    assert all(p.fix for p in caught.value.problems)
    return caught.value


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[1, 2, 3]", "no `model_type`"),
        ('{"model_type": "llama",\n "hidden_size": ,}', "not valid JSON"),
        ("", "not valid JSON"),
        (b"\x89PNG\x00\xff\xfe", "not a text file"),
        (json.dumps({k: v for k, v in PRINTABLE.items() if k != "model_type"}), "model_type"),
        (json.dumps({**PRINTABLE, "model_type": "llamax"}), "not known to transformers"),
        (json.dumps({**PRINTABLE, "hidden_size": -4096}), "not a positive whole number"),
        (json.dumps({**PRINTABLE, "vocab_size": 1.5}), "not a positive whole number"),
        (json.dumps({**PRINTABLE, "num_key_value_heads": 3}), "cannot share 3 key/value heads"),
        (json.dumps({**PRINTABLE, "hidden_size": 4095}), "transformers refuses"),
        (json.dumps({**PRINTABLE, "num_hidden_layers": "32"}), "positive whole number"),
    ],
    ids=[
        "json-list",
        "broken-json",
        "empty",
        "binary",
        "no-model-type",
        "unknown-arch",
        "negative-size",
        "float-vocab",
        "uneven-kv-heads",
        "heads-do-not-divide",
        "layers-as-text",
    ],  # fmt: skip
)
def test_s1_a_config_json_that_is_not_one_names_the_file_and_the_fix(
    tmp_path: Path, text: str | bytes, said: str
) -> None:
    err = _refusal(tmp_path, text)
    assert said in " ".join(p.found for p in err.problems)


def test_s1_a_folder_without_config_json_says_what_to_put_there(
    tmp_path: Path,
) -> None:
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    with pytest.raises(InputError, match="no config.json"):
        architecture_config(ModelSettings(name_or_path=str(tmp_path / "tok")), tmp_path)


def test_s1_max_length_beyond_the_models_positions_is_refused(
    tmp_path: Path,
) -> None:
    from tunepilot.data.workspace import Workspace
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.sizing.dry_run.run import dry_run

    path = write_demo_campaign(tmp_path, "extraction", tiny=True, n_conversations=20,
                               overrides={"data.fields.time": None})  # fmt: skip
    ws = Workspace.open(path, ["model.name_or_path=llama-3-8b-config", "data.max_length=9000"])
    with pytest.raises(InputError) as caught:
        dry_run(ws)
    problem = caught.value.problems[0]
    assert problem.where == "data.max_length" and "max_position_embeddings 8192" in problem.found
    assert "llama-3-8b-config.json" in problem.found and "at most 8192" in problem.fix


@pytest.mark.parametrize(
    ("text", "said"),
    [("- a\n- b\n", "not a mapping"), ("cards: [\n", "not valid YAML"),
     (b"\x89PNG\x00\xff", "not a text file")],
    ids=["list", "broken-yaml", "binary"],
)  # fmt: skip
def test_l1_a_catalog_that_is_not_one_names_the_file(
    tmp_path: Path, text: str | bytes, said: str
) -> None:
    from tunepilot.sizing.catalog import load_catalog

    path = tmp_path / "gpus.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError) as caught:
        load_catalog(path)
    assert str(path) in caught.value.title and said in caught.value.problems[0].found


def test_s1_size_exits_2_with_one_json_document_for_a_bad_config(
    tmp_path: Path,
) -> None:
    from tunepilot.demo.campaign import write_demo_campaign

    path = write_demo_campaign(tmp_path, "extraction", tiny=True, n_conversations=20,
                               overrides={"data.fields.time": None})  # fmt: skip
    bad = tmp_path / "bad-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**PRINTABLE, "hidden_size": -1}))
    done = subprocess.run(
        [sys.executable, "-m", "tunepilot.cli", "size", str(path),
         f"model.name_or_path={bad}", "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)  # the whole of stdout is one JSON document
    assert out["exit_code"] == 2 and str(bad / "config.json") in out["problems"][0]["where"]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n.startswith("gemma") else pytest.mark.slow)
     for n in sorted(shipped_configs())],
)  # fmt: skip
def test_s1_every_shipped_config_dry_runs_with_its_real_attention(
    tmp_path: Path, name: str
) -> None:
    """Each shipped config sizes end to end. Gemma 2 has no SDPA attention (its soft-cap): a run
    falls back to eager, so the dry run sizes eager and says so, and an explicit sdpa is bad
    input (it used to fail as 'base model not loadable': transformers read the stand-in's name
    as an SDPA request)."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.sizing.dry_run.run import dry_run

    path = write_demo_campaign(tmp_path, "extraction", tiny=True, n_conversations=20,
                               overrides={"data.fields.time": None, "data.max_length": 32,
                                          "training.eval_batch_size": 1})  # fmt: skip
    ws = Workspace.open(path, [f"model.name_or_path={name}"])
    result = dry_run(ws)
    attention = result.phase("steady step").inputs["attention"]
    assert (
        result.phase("steady step").flops > 0
        and result.layers == json.loads(shipped_configs()[name].read_text())["num_hidden_layers"]
    )
    if name.startswith("gemma"):
        assert attention == "eager" and any("no SDPA attention" in n for n in result.notes)
        explicit = Workspace.open(path, [f"model.name_or_path={name}",
                                         "model.attn_implementation=sdpa"])  # fmt: skip
        with pytest.raises(InputError, match="attention not available"):
            dry_run(explicit)
    else:
        assert attention == "sdpa"
