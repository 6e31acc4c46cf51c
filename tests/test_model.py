"""P1-P3, S3: full or LoRA, what is trained is counted, and an update moves exactly that."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tunepilot.campaign import LoraSettings, ModelSettings
from tunepilot.model.base import resolve_source
from tunepilot.model.build import (
    SetupFailure,
    apply_method,
    check_new_head_trainable,
    enable_activation_checkpointing,
    load_model,
)
from tunepilot.model.params import trainable_report, update_audit
from tunepilot.verdict import Verdict

LABELS = ["billing", "delivery", "refund"]


def _settings(path: Path, method: str = "lora", **lora: object) -> ModelSettings:
    return ModelSettings(name_or_path=str(path), method=method, lora=LoraSettings(**lora))


def _bert_cls(path: Path, method: str = "lora", **lora: object):
    settings = _settings(path, method, **lora)
    loaded = load_model(resolve_source(settings), "classification", settings, LABELS)
    return loaded, settings


def _cls_loss(model) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (4, 12), generator=gen)
    return model(input_ids=ids, labels=torch.tensor([0, 1, 2, 1])).loss


def _lm_loss(model) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 200, (2, 16), generator=gen)
    return model(input_ids=ids, labels=ids).loss


def _adamw_trainable(model) -> torch.optim.Optimizer:
    # weight_decay 0 as the campaign default: decoupled decay would move lora_A on update 1
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)


def _state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def tiny_bert_mlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BERT saved from BertForMaskedLM, as `run_mlm.py` domain adaptation leaves it: no pooler.

    Its seq-cls model gets a new `bert.pooler.dense` *and* a new `classifier`; peft (SEQ_CLS)
    auto-saves `classifier` only, so the random pooler would stay frozen: the real path the
    new-head check exists for. (DistilBERT's `pre_classifier` is saved by peft's suffix match.)
    """
    from transformers import BertConfig, BertForMaskedLM

    directory = tmp_path_factory.mktemp("tiny-bert-mlm")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    BertForMaskedLM(config).save_pretrained(str(directory))
    return directory


def test_p1_classification_load_names_the_new_head_and_label_order(tiny_bert_dir: Path) -> None:
    loaded, _ = _bert_cls(tiny_bert_dir)
    assert loaded.new_head_modules == ["classifier"]
    assert loaded.new_keys == ["classifier.bias", "classifier.weight"]
    assert loaded.model.config.id2label == dict(enumerate(LABELS))
    assert loaded.model.config.num_labels == 3
    assert any("newly initialised" in n and "classifier.weight" in n for n in loaded.notes)


def test_p1_load_report_is_quiet(tiny_bert_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _bert_cls(tiny_bert_dir)
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err
    assert "Loading weights" not in out + err


def test_p1_full_fine_tuning_trains_every_parameter(tiny_bert_dir: Path) -> None:
    loaded, settings = _bert_cls(tiny_bert_dir, method="full")
    model = apply_method(loaded, settings)
    assert all(p.requires_grad for p in model.parameters())
    report = trainable_report(model)
    assert report.method == "full" and report.frozen_params == 0
    assert report.trainable_params == sum(p.numel() for p in model.parameters())


def test_p2_lora_report_counts_adapters_and_saved_head(tiny_bert_dir: Path) -> None:
    loaded, settings = _bert_cls(tiny_bert_dir, r=4, target_modules=["query", "value"])
    model = apply_method(loaded, settings)
    report = trainable_report(model)
    # 2 layers x (query, value) x (A: 4x64 + B: 64x4) + peft's copy of the head (64x3 + 3)
    assert report.trainable_params == 2 * 2 * (4 * 64 + 64 * 4) + 64 * 3 + 3
    assert report.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert report.total_params == sum(p.numel() for p in model.parameters())
    assert report.trainable_bytes == 4 * report.trainable_params  # float32
    assert (report.lora_rank, report.lora_alpha) == (4, 16)
    assert report.target_modules == ["query", "value"]
    assert len(report.adapted_modules) == 4
    assert report.extra_saved == {"classifier": 64 * 3 + 3}  # peft auto-saved it (SEQ_CLS)
    assert json.loads(json.dumps(report.to_json()))["total_params"] == report.total_params

    from rich.console import Console

    console = Console(record=True, width=160)
    report.print(console)
    text = console.export_text()
    assert "layer.*.attention.self.query.lora_A.default" in text
    assert f"{report.trainable_params:,} trainable" in text


def test_p1_target_pattern_matching_nothing_fails_listing_linear_names(tiny_bert_dir: Path) -> None:
    loaded, settings = _bert_cls(tiny_bert_dir, target_modules=["query", "q_proj"])
    with pytest.raises(SetupFailure) as err:
        apply_method(loaded, settings)
    finding = err.value.finding
    assert finding.verdict is Verdict.FAIL
    assert finding.details["unmatched"] == ["q_proj"]
    assert {"query", "key", "value", "dense", "classifier"} <= set(
        finding.details["linear_modules"]
    )
    assert "q_proj" in finding.sentence and "query" in finding.sentence


def test_p1_an_empty_lora_target_list_is_refused_not_a_peft_traceback(
    tiny_bert_dir: Path,
) -> None:
    """`target_modules: []` reached peft, whose NoMatchingPeftModuleError was exit 3: the
    schema refuses it, and the set-up check FAILs a list that adapts no module at all."""
    from pydantic import ValidationError

    from tunepilot.model.setup_checks import check_target_modules

    with pytest.raises(ValidationError, match="target_modules"):
        LoraSettings(target_modules=[])
    loaded, _ = _bert_cls(tiny_bert_dir)
    finding = check_target_modules(loaded.model, [], ["classifier"])
    assert finding.verdict is Verdict.FAIL and "query" in finding.sentence


def test_p2_new_layer_left_frozen_by_lora_fails_with_the_fix(tiny_bert_mlm_dir: Path) -> None:
    settings = _settings(tiny_bert_mlm_dir, target_modules=["query", "value"])
    loaded = load_model(resolve_source(settings), "classification", settings, LABELS)
    assert loaded.new_head_modules == ["bert.pooler.dense", "classifier"]
    with pytest.raises(SetupFailure) as err:
        apply_method(loaded, settings)
    finding = err.value.finding
    assert finding.verdict is Verdict.FAIL
    # peft saved `classifier` on its own, so only the pooler is left random and frozen
    assert finding.details["frozen_new_keys"] == [
        "bert.pooler.dense.bias",
        "bert.pooler.dense.weight",
    ]
    # `dense` alone would make peft save every dense layer: the fix names the pooler's suffix
    assert "add `pooler.dense` to model.lora.modules_to_save" in finding.sentence


def test_p2_new_layer_in_modules_to_save_passes(tiny_bert_mlm_dir: Path) -> None:
    settings = _settings(
        tiny_bert_mlm_dir, target_modules=["query", "value"], modules_to_save=["pooler.dense"]
    )
    loaded = load_model(resolve_source(settings), "classification", settings, LABELS)
    model = apply_method(loaded, settings)
    assert check_new_head_trainable(model, loaded.new_keys).verdict is Verdict.PASS
    assert set(trainable_report(model).extra_saved) == {"bert.pooler.dense", "classifier"}


def test_p2_frozen_head_check_fires_on_a_real_peft_model(tiny_bert_dir: Path) -> None:
    """Without task_type, peft does not save the head: the check must see that on the model."""
    from peft import LoraConfig, get_peft_model

    loaded, _ = _bert_cls(tiny_bert_dir)
    with pytest.warns(FutureWarning):  # peft asks transformers' deprecated checkpointing flag
        model = get_peft_model(loaded.model, LoraConfig(r=2, target_modules=["query"]))
    finding = check_new_head_trainable(model, loaded.new_keys)
    assert finding.verdict is Verdict.FAIL
    assert finding.details["frozen_new_keys"] == ["classifier.bias", "classifier.weight"]


def test_p3_update_audit_passes_on_lora_and_restores_the_model(tiny_llama_dir: Path) -> None:
    settings = _settings(tiny_llama_dir, r=4, target_modules=["q_proj", "v_proj"])
    loaded = load_model(resolve_source(settings), "causal_lm", settings)
    assert loaded.new_keys == []
    model = apply_method(loaded, settings)
    model.eval()
    before = _state(model)
    findings = update_audit(model, _lm_loss, _adamw_trainable)
    assert [f.verdict for f in findings] == [Verdict.PASS, Verdict.PASS], findings
    late = findings[1].details["moved_from_update_2"]
    assert late and all("lora_A" in n for n in late)  # B starts at zero: A moves on update 2
    after = _state(model)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())


def test_p3_update_audit_passes_on_full_fine_tuning(tiny_bert_dir: Path) -> None:
    loaded, settings = _bert_cls(tiny_bert_dir, method="full")
    model = apply_method(loaded, settings)
    findings = update_audit(model, _cls_loss, _adamw_trainable)
    assert {f.verdict for f in findings} == {Verdict.PASS}, findings
    assert str(len(list(model.parameters()))) in findings[1].sentence


def test_p3_update_audit_fails_when_frozen_params_change(tiny_bert_dir: Path) -> None:
    loaded, settings = _bert_cls(tiny_bert_dir, r=4, target_modules=["query", "value"])
    model = apply_method(loaded, settings)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}

    def unfreeze_everything(m) -> torch.optim.Optimizer:  # a real bug: "train all of it"
        for p in m.parameters():
            p.requires_grad_(True)
        return torch.optim.AdamW(m.parameters(), lr=1e-2)

    findings = update_audit(model, _cls_loss, unfreeze_everything)
    frozen = findings[0]
    assert frozen.check == "update-frozen-unchanged" and frozen.verdict is Verdict.FAIL
    changed = frozen.details["changed_frozen"]
    assert "base_model.model.bert.embeddings.word_embeddings.weight" in changed
    assert not any("lora_" in n for n in changed)
    assert frozen.details["requires_grad_flipped"]
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags  # restored


def test_p3_trainable_tensor_the_loss_never_reaches_is_named(tiny_bert_dir: Path) -> None:
    loaded, settings = _bert_cls(tiny_bert_dir, method="full")
    model = apply_method(loaded, settings)

    def loss_without_pooler(m) -> torch.Tensor:  # uses the encoder only; pooler gets no grad
        ids = torch.randint(5, 200, (2, 8), generator=torch.Generator().manual_seed(3))
        return m.bert(input_ids=ids).last_hidden_state.pow(2).mean()

    findings = update_audit(model, loss_without_pooler, _adamw_trainable)
    moved = findings[1]
    assert moved.verdict is Verdict.FAIL
    assert "bert.pooler.dense.weight" in moved.details["not_moved"]
    assert moved.details["grad_norms"]["bert.pooler.dense.weight"] is None


def test_s3_activation_checkpointing_keeps_lora_gradients(tiny_llama_dir: Path) -> None:
    settings = _settings(tiny_llama_dir, r=4, target_modules=["q_proj", "v_proj"])
    model = apply_method(load_model(resolve_source(settings), "causal_lm", settings), settings)
    notes = enable_activation_checkpointing(model)
    assert model.get_base_model().is_activation_checkpointing
    assert any("non-reentrant" in n for n in notes)
    findings = update_audit(model, _lm_loss, _adamw_trainable)
    assert {f.verdict for f in findings} == {Verdict.PASS}, findings


def test_d6_checkpoint_head_labels_are_recorded_and_a_reorder_noted(tmp_path: Path) -> None:
    from tunepilot.model.tiny import build_tiny_bert

    folder = build_tiny_bert(
        tmp_path / "headed", with_head_labels=["refund", "billing", "delivery"]
    )
    loaded, _ = _bert_cls(folder)
    assert loaded.new_keys == []  # the trained head was loaded
    assert loaded.checkpoint_labels == ["refund", "billing", "delivery"]
    assert any("check D6" in n for n in loaded.notes)


def test_p1_checkpoint_head_of_another_size_is_an_input_error(tmp_path: Path) -> None:
    from tunepilot.errors import InputError
    from tunepilot.model.tiny import build_tiny_bert

    folder = build_tiny_bert(tmp_path / "two", with_head_labels=["a", "b"])
    with pytest.raises(InputError) as err:
        _bert_cls(folder)
    assert "does not fit 3 labels" in err.value.problems[0].found
    assert "['a', 'b']" in err.value.problems[0].found
