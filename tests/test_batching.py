"""S2, S7, R1, B3: the sampler's order, its resumable state, sharding, and dynamic padding."""

from __future__ import annotations

import random

import pytest

from tunepilot.errors import InputError
from tunepilot.tasks.base import IGNORE_INDEX, Encoded
from tunepilot.train.batching import UpdateSampler, collate, count_targets

_RNG = random.Random(7)
LENGTHS = [_RNG.randint(3, 90) for _ in range(203)]


def _sampler(**kw: object) -> UpdateSampler:
    args: dict = {"microbatch": 2, "accumulation": 4, "seed": 3} | kw
    lengths = args.pop("lengths", LENGTHS)
    return UpdateSampler(lengths, **args)


def _flat(updates: list[list[list[int]]]) -> list[int]:
    return [i for update in updates for mb in update for i in mb]


def _epoch(sampler: UpdateSampler) -> list[list[list[int]]]:
    return [sampler.next_update().microbatches for _ in range(sampler.plan.updates_per_epoch)]


@pytest.mark.parametrize("bucket", [False, True])
def test_s7_one_epoch_sees_every_example_once_and_only_the_last_update_is_partial(
    bucket: bool,
) -> None:
    sampler = _sampler(bucket_by_length=bucket)
    updates = _epoch(sampler)
    assert sorted(_flat(updates)) == list(range(len(LENGTHS)))
    sizes = [sum(len(mb) for mb in u) for u in updates]
    assert sizes[:-1] == [8] * (len(updates) - 1) and sizes[-1] == 203 % 8
    assert all(len(mb) == 2 for u in updates[:-1] for mb in u)


def test_r1_order_depends_only_on_seed_and_epoch() -> None:
    a, b, c = _sampler(), _sampler(), _sampler(seed=4)
    first_a, first_b, first_c = _epoch(a), _epoch(b), _epoch(c)
    assert first_a == first_b
    assert first_a != first_c
    assert _epoch(a) != first_a  # the next epoch is reshuffled


def test_r1_state_dict_resumes_at_the_exact_position_without_replay() -> None:
    straight = _sampler(bucket_by_length=True)
    expected = [straight.next_update() for _ in range(60)]  # crosses two epoch boundaries
    interrupted = _sampler(bucket_by_length=True)
    for _ in range(37):
        interrupted.next_update()
    resumed = _sampler(bucket_by_length=True)
    resumed.load_state_dict(interrupted.state_dict())
    assert [resumed.next_update() for _ in range(23)] == expected[37:]


def test_r1_state_from_other_data_or_batching_is_refused() -> None:
    state = _sampler().state_dict()
    with pytest.raises(InputError) as err:
        _sampler(lengths=LENGTHS[:-1]).load_state_dict(state)
    assert any("n_examples" in p.where for p in err.value.problems)
    with pytest.raises(InputError):
        _sampler(microbatch=4).load_state_dict(state)


def test_s2_length_bucketing_reduces_padding_and_keeps_updates_shuffled() -> None:
    def padding(sampler: UpdateSampler) -> int:
        return sum(
            max(LENGTHS[i] for i in mb) * len(mb) - sum(LENGTHS[i] for i in mb)
            for u in _epoch(sampler)
            for mb in u
        )

    assert padding(_sampler(bucket_by_length=True)) < padding(_sampler()) / 2
    firsts = [max(LENGTHS[i] for i in u[0]) for u in _epoch(_sampler(bucket_by_length=True))]
    assert firsts != sorted(firsts)  # not a short-to-long curriculum


@pytest.mark.parametrize("bucket", [False, True])
def test_b3_world_2_x_accumulation_4_sees_the_same_updates_as_world_1_x_8(bucket: bool) -> None:
    single = _sampler(accumulation=8, bucket_by_length=bucket)
    ranks = [
        _sampler(accumulation=4, world_size=2, rank=r, bucket_by_length=bucket) for r in (0, 1)
    ]
    for _ in range(single.plan.updates_per_epoch * 2):
        whole = single.next_update()
        shares = [s.next_update() for s in ranks]
        union = sorted(i for s in shares for mb in s.microbatches for i in mb)
        assert union == sorted(i for mb in whole.microbatches for i in mb)
        assert all(s.update_examples == whole.update_examples for s in shares)
        mine = [set(i for mb in s.microbatches for i in mb) for s in shares]
        assert not mine[0] & mine[1]


def test_b3_a_rank_without_a_share_of_a_partial_update_gets_a_ghost() -> None:
    # 17 examples, 16 per update: the second update is one example on rank 0 only.
    ranks = [_sampler(lengths=[5] * 17, accumulation=4, world_size=2, rank=r) for r in (0, 1)]
    for s in ranks:
        s.next_update()
    zero, one = (s.next_update() for s in ranks)
    assert sum(len(mb) for mb in zero.microbatches) == 1 and zero.ghost is None
    assert one.microbatches == [] and one.ghost == zero.microbatches[0]


def test_s7_drop_last_drops_the_remainder_each_epoch() -> None:
    sampler = _sampler(drop_last=True)
    updates = _epoch(sampler)
    assert len(updates) == 203 // 8
    assert len(_flat(updates)) == 200
    assert sampler.next_update().epoch == 1


def _enc(ids: list[int], labels: list[int]) -> Encoded:
    return Encoded("x", ids, labels, 0, False, False, len(ids))


def test_s2_collate_pads_dynamically_and_masks_padding_from_the_loss() -> None:
    short = _enc([5, 6, 7], [IGNORE_INDEX, 6, 7])
    long = _enc([8, 9, 10, 11, 12], [IGNORE_INDEX] * 2 + [10, 11, 12])
    batch = collate([short, long], "causal_lm", pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["labels"][0].tolist() == [IGNORE_INDEX, 6, 7, IGNORE_INDEX, IGNORE_INDEX]
    # After the shift: 2 targets in row 0, 3 in row 1.
    assert count_targets(batch, "causal_lm") == 5


def test_s2_the_first_label_of_a_row_carries_no_loss_after_the_shift() -> None:
    batch = collate([_enc([5, 6, 7], [5, 6, 7])], "causal_lm", pad_id=0)
    assert count_targets(batch, "causal_lm") == 2


def test_s2_collate_classification_gives_one_class_id_per_example() -> None:
    batch = collate([_enc([1, 2], [2]), _enc([3], [0])], "classification", pad_id=0)
    assert batch["labels"].tolist() == [2, 0]
    assert count_targets(batch, "classification") == 2
    with pytest.raises(ValueError, match="one class id"):
        collate([_enc([1, 2], [2, 1])], "classification", pad_id=0)
