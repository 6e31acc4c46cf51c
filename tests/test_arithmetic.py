"""S7: examples per update = microbatch x accumulation x data replicas, and what follows."""

from __future__ import annotations

import sys

import pytest

from tunepilot.campaign import TrainingSettings
from tunepilot.errors import InputError
from tunepilot.train.arithmetic import plan_from_settings, plan_updates


def test_s7_seed_example_3200_examples_16_per_update_is_200_updates() -> None:
    plan = plan_updates(3200, microbatch=2, accumulation=8, replicas=1, epochs=1)
    assert plan.examples_per_update == 16
    assert plan.updates_per_epoch == 200
    assert plan.total_updates == 200
    assert plan.partial_update_examples == 0
    assert plan.dropped_per_epoch == 0
    assert plan.examples_seen == 3200
    assert plan.held == "epochs"
    sentence = plan.describe()
    assert "16 examples per update" in sentence and "200 updates per epoch" in sentence


def test_s7_holding_updates_fixed_records_examples_seen_and_epochs() -> None:
    plan = plan_updates(3200, 2, 8, updates=200)
    assert plan.held == "updates" and plan.epochs == pytest.approx(1.0)
    # Doubling the batch at fixed updates doubles what is seen: the plan must say so.
    bigger = plan_updates(3200, 4, 8, updates=200)
    assert bigger.examples_seen == 6400 and bigger.epochs == pytest.approx(2.0)
    assert "Holding 200 updates fixed" in bigger.describe()


def test_s7_holding_epochs_fixed_changes_updates_when_the_batch_changes() -> None:
    small = plan_updates(3200, 2, 8, epochs=3)
    big = plan_updates(3200, 4, 8, epochs=3)
    assert (small.total_updates, big.total_updates) == (600, 300)
    assert small.examples_seen == big.examples_seen == 9600


def test_s2_a_final_partial_update_counts_without_drop_last() -> None:
    plan = plan_updates(3205, 2, 8, epochs=1)
    assert plan.updates_per_epoch == 201
    assert plan.partial_update_examples == 5
    assert plan.examples_seen == 3205
    assert "the last one partial, 5 examples" in plan.describe()


def test_s7_drop_last_drops_the_remainder_and_counts_it() -> None:
    plan = plan_updates(3205, 2, 8, epochs=2, drop_last=True)
    assert plan.updates_per_epoch == 200
    assert plan.dropped_per_epoch == 5
    assert plan.total_updates == 400
    assert plan.examples_seen == 6400
    assert "5 examples dropped per epoch" in plan.describe()


def test_s7_updates_budget_across_epochs_counts_partial_updates_exactly() -> None:
    # 13 examples, 8 per update: updates alternate 8, 5, 8, 5 ...
    plan = plan_updates(13, 2, 4, updates=3)
    assert plan.updates_per_epoch == 2
    assert plan.examples_seen == 13 + 8
    assert plan.examples_after(4) == 26


def test_s7_data_replicas_multiply_the_batch() -> None:
    one = plan_updates(3200, 2, 8, replicas=1, epochs=1)
    two = plan_updates(3200, 2, 4, replicas=2, epochs=1)
    assert two.examples_per_update == one.examples_per_update == 16
    assert two.total_updates == one.total_updates == 200
    assert "x 2 replicas" in two.describe()


def test_s7_replicas_follow_the_distribution_strategy_not_model_parallelism() -> None:
    ddp = TrainingSettings(distributed={"strategy": "ddp", "nproc": 4}, budget={"epochs": 1})
    none = TrainingSettings(distributed={"strategy": "none", "nproc": 4}, budget={"epochs": 1})
    assert plan_from_settings(3200, ddp).examples_per_update == 2 * 8 * 4
    assert plan_from_settings(3200, none).examples_per_update == 2 * 8


def test_s7_drop_last_with_too_few_examples_is_an_input_error_naming_the_key() -> None:
    with pytest.raises(InputError) as err:
        plan_updates(10, 2, 8, updates=5, drop_last=True)
    assert err.value.problems[0].where == "training.drop_last"
    assert "cannot fill one update of 16" in err.value.problems[0].found


def test_s7_fractional_epochs_round_up_without_float_noise() -> None:
    assert plan_updates(3200, 2, 8, epochs=0.1).total_updates == 20
    assert plan_updates(3200, 2, 8, epochs=0.101).total_updates == 21


def test_s7_arithmetic_imports_without_torch() -> None:
    import subprocess

    code = "import tunepilot.train.arithmetic, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
