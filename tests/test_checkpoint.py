"""R1, R4: checkpoints hold the whole training state, verify themselves, refuse pickles."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from tunepilot.errors import InputError
from tunepilot.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)

torch = pytest.importorskip("torch")

SAMPLER = {"epoch": 1, "position": 3, "seed": 5}


def lora_model(path: Path, r: int = 4):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(path))
    config = LoraConfig(r=r, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)  # fmt: skip
    return get_peft_model(base, config)


def trained(model):
    """A model and an AdamW that has taken two steps, so it has real state."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    for _ in range(2):
        ids = torch.tensor([[5, 6, 7, 8, 9]])
        model(input_ids=ids).logits.pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def save(run: Path, model, optimizer, update: int = 4, keep: int = 3) -> Path:
    return save_checkpoint(run, update, model, optimizer, SAMPLER, {"seed": 5}, keep)


def test_r1_lora_checkpoint_round_trips_weights_optimizer_and_state(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    model = lora_model(tiny_llama_dir)
    optimizer = trained(model)
    folder = save(tmp_path, model, optimizer)
    assert folder == tmp_path / "checkpoints" / "step-000004"
    names = {p.name for p in folder.iterdir()}
    assert names >= {
        "adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors",
        "optimizer.json", "rng.safetensors", "state.json", "MANIFEST.json",
    }  # fmt: skip
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    assert set(manifest["files"]) == names - {"MANIFEST.json"}

    fresh = lora_model(tiny_llama_dir)  # same init seed: perturb it so the load must work
    with torch.no_grad():
        for p in fresh.parameters():
            if p.requires_grad:
                p.add_(1.0)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    state = load_checkpoint(folder, fresh, fresh_opt)
    assert state["update"] == 4 and state["sampler"] == SAMPLER and state["seed"] == 5
    assert "torch_cpu" in state["rng_tensors"]
    for name, value in trainable(model).items():
        assert torch.equal(value, trainable(fresh)[name]), name
    before, after = optimizer.state_dict(), fresh_opt.state_dict()
    assert before["param_groups"] == after["param_groups"]
    for index, per_param in before["state"].items():
        for key, value in per_param.items():
            assert torch.equal(value, after["state"][index][key]), (index, key)


def test_r1_full_fine_tune_checkpoint_saves_the_whole_state_dict(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
    optimizer = trained(model)
    folder = save(tmp_path, model, optimizer)
    assert (folder / "model.safetensors").is_file()
    fresh = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
    load_checkpoint(folder, fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2))
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.fixture
def checkpoint(tiny_llama_dir: Path, tmp_path: Path) -> tuple[Path, object, object]:
    model = lora_model(tiny_llama_dir)
    optimizer = trained(model)
    return save(tmp_path, model, optimizer), model, optimizer


def refused(folder: Path) -> list:
    with pytest.raises(InputError) as err:
        verify_checkpoint(folder)
    return err.value.problems


def test_r4_a_flipped_byte_is_caught_and_the_file_named(checkpoint) -> None:
    folder, model, optimizer = checkpoint
    target = folder / "optimizer.safetensors"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    problems = refused(folder)
    assert len(problems) == 1
    assert problems[0].where == str(target) and "sha256" in problems[0].found
    with pytest.raises(InputError):  # loading verifies first
        load_checkpoint(folder, model, optimizer)


def test_r4_a_missing_file_is_caught(checkpoint) -> None:
    folder, _, _ = checkpoint
    (folder / "state.json").unlink()
    problems = refused(folder)
    assert problems[0].where.endswith("state.json") and "missing" in problems[0].found


def test_r4_an_added_pickle_is_refused_even_under_another_name(checkpoint) -> None:
    folder, _, _ = checkpoint
    payload = pickle.dumps({"x": 1}, protocol=4)
    (folder / "extra.pkl").write_bytes(payload)
    (folder / "notes.json").write_bytes(payload)  # pickle bytes behind a harmless suffix
    torch.save({"w": torch.zeros(2)}, folder / "weights.safetensors")  # a renamed torch.save
    problems = {Path(p.where).name: p.found for p in refused(folder)}
    assert set(problems) == {"extra.pkl", "notes.json", "weights.safetensors"}
    assert "pickle" in problems["extra.pkl"] and "pickle" in problems["notes.json"]


def test_r4_an_unlisted_safe_file_is_still_reported(checkpoint) -> None:
    folder, _, _ = checkpoint
    (folder / "later.json").write_text("{}")
    assert "not listed" in refused(folder)[0].found


def test_r4_a_corrupt_manifest_is_an_input_error(checkpoint) -> None:
    folder, _, _ = checkpoint
    (folder / "MANIFEST.json").write_text("{not json")
    assert "manifest" in refused(folder)[0].found


def test_r1_loading_into_a_different_adapter_names_the_mismatch(
    checkpoint, tiny_llama_dir: Path
) -> None:
    folder, _, _ = checkpoint
    other = lora_model(tiny_llama_dir, r=8)
    opt = torch.optim.AdamW([p for p in other.parameters() if p.requires_grad])
    with pytest.raises(InputError, match="does not match"):
        load_checkpoint(folder, other, opt)


def test_r1_keep_last_n_deletes_older_folders_after_the_new_one_is_in_place(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    model = lora_model(tiny_llama_dir)
    optimizer = trained(model)
    for update in (2, 4, 6, 8):
        save(tmp_path, model, optimizer, update=update, keep=2)
    steps = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert steps == ["step-000006", "step-000008"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-000008"


def test_r1_a_half_written_checkpoint_is_never_the_latest(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    model = lora_model(tiny_llama_dir)
    optimizer = trained(model)
    save(tmp_path, model, optimizer, update=2)
    (tmp_path / "checkpoints" / ".tmp-step-000004-999").mkdir()  # a save killed mid-way
    (tmp_path / "checkpoints" / "step-000006").mkdir()  # no manifest: not complete
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-000002"
    save(tmp_path, model, optimizer, update=8)
    assert not (tmp_path / "checkpoints" / ".tmp-step-000004-999").exists()


def test_r1_saving_the_same_step_again_replaces_it_whole(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    model = lora_model(tiny_llama_dir)
    optimizer = trained(model)
    save(tmp_path, model, optimizer, update=4)
    folder = save(tmp_path, model, optimizer, update=4)
    verify_checkpoint(folder)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000004"]


def _rewrite_to_match(folder: Path, name: str, data: bytes) -> None:
    """Damage one file and rewrite MANIFEST.json to match it: what a hand edit, or a writer
    that produced a truncated file and then hashed it, leaves behind."""
    import hashlib

    (folder / name).write_bytes(data)
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("adapter_model.safetensors", "truncate"),
        ("optimizer.safetensors", "truncate"),
        ("rng.safetensors", "truncate"),
        ("optimizer.json", b"{not json"),
        ("optimizer.json", b"[1]"),
        ("optimizer.json", b'{"param_groups": [{}], "non_tensor_state": {}}'),
        ("state.json", b"[1, 2]"),
    ],
)
def test_r1_r4_a_damaged_file_its_manifest_matches_falls_back_to_the_older_checkpoint(
    tiny_llama_dir: Path, tmp_path: Path, name: str, damage: object
) -> None:
    """Not a SafetensorError or JSONDecodeError traceback (exit 3): the checkpoint is refused
    naming the file, and resume falls back to the newest older one, the model untouched."""
    from tunepilot.train.resume_point import load_resumable

    model = lora_model(tiny_llama_dir)
    optimizer = trained(model)
    save(tmp_path, model, optimizer, update=2)
    at_two = trainable(model)
    trained_more = trained(model)
    newest = save(tmp_path, model, trained_more, update=4)
    data = (newest / name).read_bytes()
    _rewrite_to_match(newest, name, data[: len(data) // 2] if damage == "truncate" else damage)

    fresh = lora_model(tiny_llama_dir)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    load = lambda f: load_checkpoint(f, fresh, fresh_opt)  # noqa: E731
    folder, state, refused = load_resumable(tmp_path, load)
    assert folder.name == "step-000002" and state["update"] == 2
    assert len(refused) == 1 and f"step-000004/{name}" in refused[0], refused
    assert all(torch.equal(v, trainable(fresh)[k]) for k, v in at_two.items())


def test_r1_a_checkpoint_of_an_adapter_named_by_a_relative_base_never_asks_the_hub(
    tiny_llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Since the adapter names its base by the campaign's own (relative) name, PEFT's "auto"
    embedding check found no local folder and asked the Hub on every save (a network call per
    checkpoint, a warning each time). The Hub call is replaced by a tripwire: no network here."""
    import warnings

    import peft.utils.save_and_load as peft_save

    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"asked the Hub: {args}")

    monkeypatch.setattr(peft_save, "check_file_exists_on_hf_hub", tripwire)
    model = lora_model(tiny_llama_dir)
    for adapter in model.peft_config.values():
        adapter.base_model_name_or_path = "base-model"  # as the runner names it
    optimizer = trained(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Could not find a config file in base-model" included
        folder = save(tmp_path, model, optimizer)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "base-model"
