"""Planted problems fail the right gate with a sentence that says what to do (S4, D7, D8,
P1, P2, S6).

Each test plants one real problem in an otherwise good tiny campaign and runs the pilot's gates
in order through the real runner, up to the gate that must catch it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot_support import one_torch_thread, tiny_campaign  # noqa: F401  (autouse fixture)
from tunepilot.data.workspace import Workspace
from tunepilot.pilot.flow import GATES, new_pilot_folder, new_state
from tunepilot.pilot.phases import PilotHooks, run_gate

torch = pytest.importorskip("torch")

def campaign(folder: Path, task: str = "classification", **overrides: object) -> Workspace:
    return Workspace.open(tiny_campaign(folder, task, **overrides))


def gates_until(ws: Workspace, last: str, hooks: PilotHooks | None = None) -> dict:
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=False, hooks=hooks)
    rows: dict = {}
    for gate in GATES:
        rows[gate.name] = run_gate(state, gate, rows)
        if gate.name == last:
            return rows
    raise AssertionError(f"no gate {last}")


def test_d8_random_split_of_grouped_data_fails_the_data_gate(tmp_path: Path) -> None:
    ws = campaign(tmp_path, **{"data.split.policy": "random"})
    rows = gates_until(ws, "load")
    data = rows["data"]
    assert data.verdict == "FAIL"
    assert "group leakage" in data.sentence and "share conversation_id" in data.sentence
    assert "split by conversation_id (split.policy: group)" in data.sentence
    assert rows["load"].verdict == "PASS"  # the data was prepared: the mechanics go on


@pytest.fixture(scope="module")
def bert_from_mlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT saved from BertForMaskedLM (as domain adaptation leaves it): no pooler. Its
    sequence classifier gets a new pooler *and* a new classifier; peft auto-saves only
    `classifier`, so the random pooler would stay frozen (see tests/test_model.py)."""
    from transformers import BertConfig, BertForMaskedLM

    from tunepilot.model.tiny import train_tokenizer

    directory = tmp_path_factory.mktemp("bert-mlm")
    tok = train_tokenizer(directory)
    torch.manual_seed(0)
    sizes = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = BertConfig(vocab_size=len(tok), intermediate_size=64, pad_token_id=tok.pad_token_id,
                        **sizes)  # fmt: skip
    BertForMaskedLM(config).save_pretrained(str(directory))
    return directory


def test_p2_a_frozen_new_head_fails_the_load_gate_with_the_module_to_save(
    tmp_path: Path, bert_from_mlm: Path
) -> None:
    ws = campaign(
        tmp_path,
        **{"model.name_or_path": str(bert_from_mlm), "model.lora.modules_to_save": ["classifier"]},
    )
    rows = gates_until(ws, "first step")
    load = rows["load"]
    assert load.verdict == "FAIL"
    assert "bert.pooler.dense.weight" in load.sentence and "are frozen" in load.sentence
    assert "add `pooler.dense` to model.lora.modules_to_save" in load.sentence
    assert rows["first step"].sentence.startswith("not run: load failed")


def test_p1_a_lora_target_that_matches_nothing_fails_the_load_gate_listing_modules(
    tmp_path: Path,
) -> None:
    ws = campaign(tmp_path, **{"model.lora.target_modules": ["q_proj", "v_proj"]})
    load = gates_until(ws, "load")["load"]
    assert load.verdict == "FAIL"
    assert "['q_proj', 'v_proj'] match no module of this model" in load.sentence
    assert "'query'" in load.sentence and "'value'" in load.sentence
    assert "fix model.lora.target_modules" in load.sentence


def test_s6_a_target_cut_by_max_length_fails_the_data_gate(tmp_path: Path) -> None:
    ws = campaign(tmp_path, "extraction", **{"data.max_length": 96})
    data = gates_until(ws, "data")["data"]
    assert data.verdict == "FAIL"
    assert "lose answer tokens at max_length 96" in data.sentence
    assert "raise data.max_length to" in data.sentence
    assert "not the same experiment" in data.sentence


def test_d7_a_learning_rate_that_overshoots_fails_the_step_and_overfit_gates(
    tmp_path: Path,
) -> None:
    """The campaign schema caps lr below 1, so lr 0.9 is the largest plantable: the loss
    explodes (finite) on the same examples, and the tiny subset cannot be learned at 9."""
    ws = campaign(tmp_path, **{"training.lr": 0.9, "model.method": "full"})
    rows = gates_until(ws, "overfit")
    steady, overfit = rows["steady step"], rows["overfit"]
    assert steady.verdict == "FAIL" and "the learning rate overshoots" in steady.sentence
    assert "lower training.lr" in steady.sentence
    assert overfit.verdict == "FAIL" and "the model cannot learn even these" in overfit.sentence
    assert "not a claim about generalisation" in overfit.sentence


def test_d7_a_non_finite_loss_in_the_overfit_names_the_update_and_a_lower_lr(
    tmp_path: Path,
) -> None:
    """The NaN is planted in a real weight by a test hook at the overfit's third update; the
    forward, the loss and the gate's handling are real. The weights are restored after."""
    calls = {"n": 0}
    state_box: dict = {}

    def poison(phase: str) -> None:
        if phase == "overfit":
            calls["n"] += 1
            if calls["n"] == 3:
                model = state_box["state"].model
                weight = next(p for n, p in model.named_parameters() if "classifier" in n
                              and p.requires_grad)  # fmt: skip
                with torch.no_grad():
                    weight.fill_(float("nan"))

    ws = campaign(tmp_path)
    pilot_id, folder = new_pilot_folder(ws.pilots_dir)
    state = new_state(ws, pilot_id, folder, tensors=False, hooks=PilotHooks(before_forward=poison))
    state_box["state"] = state
    rows: dict = {}
    for gate in GATES[: [g.name for g in GATES].index("evaluation") + 1]:
        rows[gate.name] = run_gate(state, gate, rows)
    overfit = rows["overfit"]
    assert overfit.verdict == "FAIL"
    assert "update 3 gave loss nan" in overfit.sentence and "lower training.lr" in overfit.sentence
    assert rows["evaluation"].verdict == "PASS"  # the trainable weights were restored
    assert all(torch.isfinite(p).all() for p in state.model.parameters())


def test_d7_answers_recovered_under_a_frozen_random_output_layer_warn_on_the_flat_loss(
    tmp_path: Path,
) -> None:
    """LoRA on every linear layer of a random tiny Llama, its output layer frozen: the argmax
    learns the 8 answers, but the loss cannot fall 4x. Mechanics work, so WARN, not FAIL."""
    ws = campaign(
        tmp_path,
        "extraction",
        **{"model.method": "lora", "model.lora.target_modules": ["all-linear"]},
    )
    overfit = gates_until(ws, "overfit")["overfit"]
    assert overfit.verdict == "WARN"
    assert overfit.details["recovered"] >= 0.9 * overfit.details["total"]
    assert overfit.details["losses"][0] < 4 * overfit.details["losses"][-1]
    assert "cannot sharpen the output" in overfit.sentence
    assert "model.lora.modules_to_save" in overfit.sentence
