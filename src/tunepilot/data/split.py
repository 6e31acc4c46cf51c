"""Train / validation / test, separated by the unit that prevents leakage (D8), test sealed (H4).

Policies: `random`, `stratified` (per-class proportions), `group` (a conversation, patient or
document goes to one split whole), `time` (train is the earliest period, test the latest; ties
never straddle a boundary) and `files` (the user's own files).

Determinism: inputs are sorted by id and shuffled with `random.Random(seed)`, so the same data
and seed give the same ids whatever the file order. The sealed test (H4) is applied on top of
the unsealed assignment: the sealed ids are the test split exactly, examples the assignment
would have put in test go to train. With unchanged data the result is therefore identical
before and after the seal exists, and a new seed never moves the test.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from tunepilot.campaign import Fields, SplitPolicy
from tunepilot.errors import InputError, Problem, ProblemList
from tunepilot.tasks.example import SPLITS, Example, Splits

SEAL_FILE = "data/test_seal.json"
_RESEAL_FIX = (
    "the data changed since the test split was sealed; for new data start a new campaign "
    "(a new `name` and folder), or delete data/test_seal.json deliberately to seal a new test "
    "(earlier test looks then no longer count)"
)


def make_splits(
    examples: Sequence[Example] | Mapping[str, Sequence[Example]],
    policy: SplitPolicy,
    fields: Fields,
    sealed_test_ids: list[str] | None = None,
) -> Splits:
    """Split `examples` (a list, or {split: examples} from the user's own files).

    Each split keeps the input order. `stratified` without labels (extraction) is `random`.
    Raises InputError for a sealed test that no longer matches, unusable group/time values,
    or an empty train/validation split."""
    by_file = dict(examples) if isinstance(examples, Mapping) else None
    flat = (
        [ex for name in SPLITS for ex in by_file.get(name, [])]
        if by_file is not None
        else list(examples)
    )
    if policy.policy == "files":
        if by_file is None or "train" not in by_file:
            raise ValueError("split policy `files` needs {split: examples} with a train entry")
        assignment = _files(by_file, policy, fields)
    elif policy.policy == "group":
        assignment = _by_group(flat, policy, fields)
    elif policy.policy == "time":
        assignment = _by_time(flat, policy, fields)
    else:
        label_of = (lambda ex: ex.label or "") if policy.policy == "stratified" else lambda ex: ""
        assignment = _stratified(flat, policy.validation, policy.test, policy.seed, label_of)
    if sealed_test_ids is not None:
        assignment = _apply_seal(flat, assignment, sealed_test_ids, policy, fields, by_file)
    splits: Splits = {name: [] for name in SPLITS}
    for ex in flat:
        splits[assignment[ex.id]].append(ex)
    _check_sizes(splits, policy)
    return splits


# --------------------------------------------------------------------------------------------
# policies: each returns id -> split name
# --------------------------------------------------------------------------------------------


def _round(x: float) -> int:
    """Round half up: Python's round() sends 0.5 to 0, which would empty a small split."""
    return int(x + 0.5)


def _sizes(n: int, validation: float, test: float) -> tuple[int, int]:
    """(validation, test) counts for n examples: at least one each when n allows it."""
    n_test = max(1 if test > 0 and n >= 3 else 0, _round(n * test))
    n_val = max(1 if validation > 0 and n >= 2 else 0, _round(n * validation))
    while n_test and n - n_test - n_val < 1:
        n_test -= 1
    while n_val and n - n_test - n_val < 1:
        n_val -= 1
    return n_val, n_test


def _stratified(
    examples: Sequence[Example],
    validation: float,
    test: float,
    seed: int,
    stratum: Callable[[Example], str],
) -> dict[str, str]:
    """Per stratum (class, or one stratum for `random`): shuffle sorted ids, cut test then
    validation. Every class with >= 3 examples reaches every split (per-class guards, H2)."""
    rng = random.Random(seed)
    strata: dict[str, list[str]] = {}
    for ex in examples:
        strata.setdefault(stratum(ex), []).append(ex.id)
    assignment: dict[str, str] = {}
    for key in sorted(strata):
        ids = sorted(strata[key])
        rng.shuffle(ids)
        n_val, n_test = _sizes(len(ids), validation, test)
        for i, ex_id in enumerate(ids):
            if i < n_test:
                assignment[ex_id] = "test"
            elif i < n_test + n_val:
                assignment[ex_id] = "validation"
            else:
                assignment[ex_id] = "train"
    return assignment


def _by_group(examples: Sequence[Example], policy: SplitPolicy, fields: Fields) -> dict[str, str]:
    """Whole groups to one split, filled in seeded order until each split has its share."""
    problems = ProblemList("data.fields.group")
    groups: dict[str, list[str]] = {}
    for ex in examples:
        if ex.group is None:
            problems.add(
                ex.source,
                f"no group value (`{fields.group}`) for a `group` split",
                f"fill `{fields.group}` on every row, or choose another split policy",
            )
        else:
            groups.setdefault(ex.group, []).append(ex.id)
    problems.raise_if_any("cannot split by group")
    order = sorted(groups)
    random.Random(policy.seed).shuffle(order)
    return _fill_whole([groups[g] for g in order], len(examples), policy)


def _fill_whole(units: Sequence[list[str]], n: int, policy: SplitPolicy,
                with_previous: Sequence[bool] = ()) -> dict[str, str]:  # fmt: skip
    """Whole units (lists of ids) to test, then validation, then train, in the order given,
    until each split holds its share of the `n` examples. `with_previous[i]` sends unit i to
    the split of unit i - 1 (a tie in time stays together)."""
    n_val, n_test = _sizes(n, policy.validation, policy.test)
    filled = {"test": 0, "validation": 0, "train": 0}
    assignment: dict[str, str] = {}
    name = "test"
    for i, ids in enumerate(units):
        if not (i < len(with_previous) and with_previous[i]):
            name = ("test" if filled["test"] < n_test else
                    "validation" if filled["validation"] < n_val else "train")  # fmt: skip
        filled[name] += len(ids)
        assignment.update(dict.fromkeys(ids, name))
    return assignment


def time_key(value: str | None) -> tuple[int, float] | None:
    """A sortable key for an ISO date/datetime or a number; None if it is neither.

    Kind 0 = number, 1 = naive datetime, 2 = aware datetime (as UTC): kinds never mix."""
    if value is None:
        return None
    try:
        return (0, float(value))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if moment.tzinfo is None:
        return (1, moment.replace(tzinfo=UTC).timestamp())
    return (2, moment.timestamp())


def _by_time(examples: Sequence[Example], policy: SplitPolicy, fields: Fields) -> dict[str, str]:
    """Train = earliest, then validation, then test, by whole units (a group, or a row when no
    group is declared). A tie at a boundary moves to the later split, so no time value appears
    in two splits and the periods do not overlap."""
    problems = ProblemList("data.fields.time")
    keyed: list[tuple[tuple[int, float], str]] = []
    for ex in examples:
        key = time_key(ex.time)
        if key is None:
            problems.add(
                ex.source,
                f"time `{ex.time}` in `{fields.time}` is neither an ISO date/datetime nor a number",
                "write times as ISO 8601 (2024-03-01 or 2024-03-01T12:00:00) or as numbers",
            )
        else:
            keyed.append((key, ex.id))
    kinds = {key[0] for key, _ in keyed}
    if len(kinds) > 1:
        problems.add(
            f"data.fields.time ({fields.time})",
            "times mix numbers, dates without a timezone and dates with one",
            "write every time the same way (all ISO dates with or without timezone, or numbers)",
        )
    problems.raise_if_any("cannot split by time")
    return _by_time_units(examples, {i: k for k, i in keyed}, policy)


def group_starts(examples: Sequence[Example], key_of: Mapping[str, tuple[int, float]]
                 ) -> dict[str, tuple[int, float]]:  # fmt: skip
    """Each group's earliest time: when the conversation (patient, document) began."""
    starts: dict[str, tuple[int, float]] = {}
    for ex in examples:
        if ex.id in key_of:
            unit = _unit(ex)
            starts[unit] = min(starts.get(unit, key_of[ex.id]), key_of[ex.id])
    return starts


def _unit(ex: Example) -> str:
    """What a time split keeps whole: the example's group, or the example alone."""
    return ex.group if ex.group is not None else f"\0{ex.id}"


def _by_time_units(
    examples: Sequence[Example], key_of: Mapping[str, tuple[int, float]], policy: SplitPolicy
) -> dict[str, str]:
    """The time split by whole units (groups when one is declared), ordered by when each began, so
    a conversation running across a period boundary never lands in two splits (D8). Train
    holds the groups that began first, test those that began last; groups that began at the
    same moment stay together in the later split. A group's later rows may be dated after
    the next split began: the audit names that carry-over as a WARN, never a leak."""
    starts = group_starts(examples, key_of)
    members: dict[str, list[str]] = {}
    for ex in examples:
        members.setdefault(_unit(ex), []).append(ex.id)
    order = sorted(starts, key=lambda g: (starts[g], g), reverse=True)  # the latest first
    ties = [i > 0 and starts[unit] == starts[order[i - 1]] for i, unit in enumerate(order)]
    return _fill_whole([members[u] for u in order], len(examples), policy, ties)


def carving_unit(fields: Fields) -> str | None:
    """What a split the tool carves must keep: the time order when a time is declared (whole
    groups within it, when a group is declared too), else whole groups, else nothing (rows
    are independent)."""
    return "time" if fields.time else "group" if fields.group else None


def _files(
    by_file: Mapping[str, Sequence[Example]], policy: SplitPolicy, fields: Fields
) -> dict[str, str]:
    """The user's files as given; a missing validation/test file is carved from train, by the
    same unit the other policies honour: whole groups, or the latest period, so the tool
    never creates the leak the audit would then report (D8)."""
    assignment = {ex.id: name for name in SPLITS for ex in by_file.get(name, [])}
    missing_val = "validation" not in by_file
    missing_test = "test" not in by_file
    if missing_val or missing_test:
        share = policy.model_copy(
            update={
                "validation": policy.validation if missing_val else 0.0,
                "test": policy.test if missing_test else 0.0,
            }
        )
        train = by_file["train"]
        unit = carving_unit(fields)
        if unit == "group":
            carved = _by_group(train, share, fields)
        elif unit == "time":
            carved = _by_time(train, share, fields)
        else:
            carved = _stratified(train, share.validation, share.test, policy.seed,
                                 lambda ex: ex.label or "")  # fmt: skip
        assignment.update(carved)
    return assignment


# --------------------------------------------------------------------------------------------
# the seal and the sanity of the result
# --------------------------------------------------------------------------------------------


def _apply_seal(
    flat: Sequence[Example],
    assignment: dict[str, str],
    sealed_ids: list[str],
    policy: SplitPolicy,
    fields: Fields,
    by_file: Mapping[str, Sequence[Example]] | None,
) -> dict[str, str]:
    """Sealed ids become the test split; nothing else may be test (H4)."""
    present = {ex.id for ex in flat}
    sealed = set(sealed_ids)
    missing = [i for i in sealed_ids if i not in present]
    if missing:
        raise InputError(
            [
                Problem(
                    SEAL_FILE,
                    f"{len(missing)} sealed test id(s) are no longer in the data "
                    f"(e.g. {', '.join(missing[:3])}); the sealed test no longer matches the "
                    "data",
                    _RESEAL_FIX,
                )
            ],
            title="the sealed test split does not match the data",
        )
    stray: list[Example] = []
    unit, pool = policy.policy, flat
    if unit == "files" and by_file is not None and "test" not in by_file:
        # A test carved from the train file keeps its unit within that file; the user's own
        # validation file is theirs (the audit reports what it shares).
        unit, pool = carving_unit(fields) or "files", list(by_file["train"])
    # What the assignment put in test but the seal does not hold (a seal written before the
    # assignment changed) goes to the split before test in time order, else to train.
    demoted = "validation" if unit == "time" else "train"
    out = {
        ex_id: ("test" if ex_id in sealed else (demoted if name == "test" else name))
        for ex_id, name in assignment.items()
    }
    if unit == "files" and by_file is not None and "test" in by_file:
        in_test_file = {ex.id for ex in by_file["test"]}
        stray = [ex for ex in flat if (ex.id in sealed) != (ex.id in in_test_file)]
    elif unit == "group":
        sealed_groups = {ex.group for ex in pool if ex.id in sealed}
        stray = [ex for ex in pool if ex.id not in sealed and ex.group in sealed_groups]
    elif unit == "time" and sealed:
        first = min(time_key(ex.time) or (0, 0.0) for ex in pool if ex.id in sealed)
        # with whole groups, a group belongs to the period it began in
        key_of = {ex.id: k for ex in pool if (k := time_key(ex.time)) is not None}
        began = group_starts(pool, key_of) if fields.group else {}
        stray = [ex for ex in pool if ex.id not in sealed
                 and began.get(ex.group or "", time_key(ex.time) or first) >= first]  # fmt: skip
    if stray:
        unit = {
            "files": "differ between the test file and the seal (in one, not the other)",
            "group": "that are not sealed share a group with the sealed test",
            "time": "that are not sealed are not earlier than the sealed test period",
        }[unit]
        raise InputError(
            [
                Problem(
                    stray[0].source,
                    f"{len(stray)} example(s) {unit} (e.g. {', '.join(ex.id for ex in stray[:3])})",
                    _RESEAL_FIX,
                )
            ],
            title="the sealed test split does not match the data",
        )
    return out


def _check_sizes(splits: Splits, policy: SplitPolicy) -> None:
    """An empty train or validation split cannot give a baseline (H3): refuse, with the counts."""
    empty = [name for name in ("train", "validation") if not splits[name]]
    if empty:
        counts = ", ".join(f"{k} {len(v)}" for k, v in splits.items())
        raise InputError(
            [
                Problem(
                    "data.split",
                    f"the `{policy.policy}` split leaves {' and '.join(empty)} empty ({counts})",
                    "add examples (or more groups / distinct times), or change "
                    "`data.split.validation` / `data.split.test`",
                )
            ],
            title="cannot split the data",
        )
