"""`tunepilot validate` judges whether the plan can do what it says (S7, V4), on the training
split as prepared from real data (banking77): a warm-up longer than the budget, a validation
interval longer than the run, a budget of one update, an update larger than the training set,
each a FAIL or WARN with its numbers; the shipped plan passes. No torch is imported."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.realdata

CAMPAIGN = {
    "name": "banking",
    "hypothesis": {"behaviour": "Route banking questions.", "task": "classification"},
    "model": {"name_or_path": "minilm"},
    "data": {"file": "train.csv", "fields": {"label": "category"},
             "split": {"policy": "stratified", "validation": 0.1, "test": 0.1}},
    "training": {"microbatch": 8, "accumulation": 4, "budget": {"updates": 200},
                 "warmup_updates": 10, "eval_every": 50},
    "variants": {"lr-2e-4": {"explain": "Double the lr.", "overrides": {"training.lr": 2.0e-4}}},
}  # fmt: skip


@pytest.fixture(scope="module")
def folder(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 banking77 training rows (1,598 after the stratified split)."""
    out = tmp_path_factory.mktemp("plan")
    with open(shared_data / "banking77" / "train.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))[:2000]
    with open(out / "train.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["text", "category"])
        writer.writeheader()
        writer.writerows(rows)
    return out


def validate(folder: Path, *overrides: str, raw: dict | None = None) -> tuple[int, dict, str]:
    (folder / "campaign.yaml").write_text(yaml.safe_dump(raw or CAMPAIGN))
    code = ("import sys\nfrom tunepilot.cli import app\n"
            f"try:\n    app(['validate', {str(folder / 'campaign.yaml')!r}, '--json', "
            f"*{list(overrides)!r}])\nexcept SystemExit as e:\n    code = e.code\n"
            "assert 'torch' not in sys.modules, 'validate imported torch'\n"
            "sys.exit(code)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def by_verdict(payload: dict, verdict: str) -> list[str]:
    return [f["sentence"] for f in payload["plan"] if f["verdict"] == verdict]


def test_s7_the_shipped_plan_passes_with_its_arithmetic(folder: Path) -> None:
    code, payload, _ = validate(folder)
    assert code == 0 and payload["ok"], payload["plan"]
    (line,) = payload["plan"]
    assert line["verdict"] == "PASS" and "= 32 examples per update" in line["sentence"]


def test_s7_v4_a_warmup_longer_than_the_budget_fails_with_its_numbers(folder: Path) -> None:
    code, payload, stderr = validate(folder, "training.warmup_updates=300")
    assert code == 1 and not payload["ok"]
    (sentence,) = by_verdict(payload, "FAIL")
    assert "training.warmup_updates 300 >= the 200 updates" in sentence
    assert "never reaches it" in sentence and "FAIL" in stderr


def test_s7_v4_eval_every_beyond_the_budget_warns_no_validation_point_inside(
    folder: Path,
) -> None:
    code, payload, _ = validate(folder, "training.eval_every=500")
    assert code == 0  # a WARN: the final evaluation still happens
    (sentence,) = by_verdict(payload, "WARN")
    assert "eval_every 500 >= the 200 updates" in sentence and "no validation point" in sentence


def test_s7_a_budget_of_one_update_fails(folder: Path) -> None:
    code, payload, _ = validate(folder, "training.budget.updates=null",
                                "training.budget.epochs=0.01")  # fmt: skip
    assert code == 1
    assert any("the budget gives 1 update" in s for s in by_verdict(payload, "FAIL"))


def test_s7_an_update_larger_than_the_training_set_fails(folder: Path) -> None:
    code, payload, _ = validate(folder, "training.microbatch=64", "training.accumulation=32")
    assert code == 1
    (sentence, *_) = by_verdict(payload, "FAIL")
    assert "= 2048 examples per update, but training holds 1598" in sentence


def test_s7_a_variant_whose_own_warmup_outlasts_the_budget_is_named(folder: Path) -> None:
    raw = json.loads(json.dumps(CAMPAIGN))
    raw["variants"]["long-warmup"] = {"explain": "A long warm-up.",
                                      "overrides": {"training.warmup_updates": 400}}  # fmt: skip
    code, payload, _ = validate(folder, raw=raw)
    assert code == 1
    (sentence,) = by_verdict(payload, "FAIL")
    assert sentence.startswith("variant `long-warmup`: training.warmup_updates 400")
