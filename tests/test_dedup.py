"""D2: exact and near-duplicate search across splits (tunepilot.data.audit.dedup)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from tunepilot.data.audit.dedup import build_index, exact_duplicates, lsh_bands, near_duplicates
from tunepilot.data.clean import clean
from tunepilot.data.normalize import normalize_text
from tunepilot.tasks.example import Example

REPO = Path(__file__).resolve().parents[1]


def ex(i: str, text: str, **context: str) -> Example:
    return Example(id=i, text=text, source=f"t:{i}", context=dict(context))


def shingles(text: str, k: int = 3) -> set[tuple[str, ...] | str]:
    """An independent reference: word k-grams of \\w+ tokens, char 3-grams for short texts."""
    words = re.findall(r"\w+", normalize_text(text))
    if len(words) >= k:
        return {tuple(words[i : i + k]) for i in range(len(words) - k + 1)}
    joined = " ".join(words)
    return {joined[i : i + 3] for i in range(max(1, len(joined) - 2))} if joined else set()


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


LONG = "my card was charged twice for the same order please refund the second payment soon"


def test_d2_exact_duplicates_group_members_per_split_after_normalisation():
    splits = {
        "train": [ex("t1", "Hello  World"), ex("t2", "hello world"), ex("t3", "other")],
        "validation": [ex("v1", "  HELLO world\n"), ex("v2", "fine")],
        "test": [ex("s1", "Cafe\u0301 open?"), ex("s2", "fine")],
        # NFC: "Café" written with a combining accent equals the precomposed one
    }
    splits["train"].append(ex("t4", "caf\u00e9 open?"))
    groups = exact_duplicates(splits)
    by_text = {g.text: g for g in groups}
    assert set(by_text) == {"hello world", "fine", "café open?"}
    hello = by_text["hello world"]
    assert hello.members == {"train": ["t1", "t2"], "validation": ["v1"]}
    assert hello.cross_split and hello.within("train") and not hello.within("validation")
    assert by_text["fine"].members == {"validation": ["v2"], "test": ["s2"]}
    assert by_text["café open?"].members == {"train": ["t4"], "test": ["s1"]}
    assert hello.size == 3


def test_d2_exact_duplicates_agree_with_the_drop_exact_duplicates_rule():
    """The audit keys texts exactly like the cleaning rule: after the rule, nothing is left,
    and the same text with different context (model input too) is not a duplicate."""
    rows = [
        ex("a", "5", slot="people"),
        ex("b", "5", slot="time"),  # same text, other context: a different example
        ex("c", " 5 ", slot="people"),  # a duplicate of a
        ex("d", "Book a table"),
        ex("e", "book a  TABLE"),
    ]
    groups = exact_duplicates({"train": rows[:3], "test": rows[3:]})
    members = [sorted(i for ids in g.members.values() for i in ids) for g in groups]
    assert members == [["a", "c"], ["d", "e"]]
    kept, _ = clean(rows, ["drop_exact_duplicates"])
    assert exact_duplicates({"train": kept}) == []
    assert [e.id for e in kept] == ["a", "b", "d"]


def test_d2_near_duplicates_across_splits_are_reported_with_exact_jaccard():
    near = LONG.replace("soon", "today")
    punct = LONG.replace("order", "order,") + "!"  # other text, same words: Jaccard 1
    splits = {
        "train": [ex("t1", LONG), ex("t2", "the parcel never arrived at my door yesterday")],
        "validation": [ex("v1", near), ex("v2", "completely unrelated words in this message")],
        "test": [ex("s1", punct)],
    }
    pairs = near_duplicates(splits, threshold=0.8)
    got = {(p.split_a, p.ids_a[0], p.split_b, p.ids_b[0]): p.jaccard for p in pairs}
    assert got == {
        ("train", "t1", "validation", "v1"): round(jaccard(LONG, near), 4),
        ("train", "t1", "test", "s1"): 1.0,
        ("validation", "v1", "test", "s1"): round(jaccard(near, punct), 4),
    }
    assert round(jaccard(LONG, near), 4) == round(12 / 14, 4)  # 13 shingles, one differs
    first = pairs[0]
    assert first.text_a == normalize_text(LONG) and first.text_b == normalize_text(near)


def test_d2_near_duplicates_leave_out_exact_copies_and_pairs_inside_one_split():
    near = LONG.replace("soon", "today")
    splits = {
        "train": [ex("t1", LONG), ex("t2", near)],  # near pair inside train: legitimate
        "validation": [ex("v1", LONG.upper())],  # an exact copy: reported as exact, not near
    }
    pairs = near_duplicates(splits)
    # v1 (exact copy of t1) is near t2 across splits; t1 ~ t2 within train is not reported.
    assert [(p.ids_a, p.ids_b) for p in pairs] == [(["t2"], ["v1"])]
    assert exact_duplicates(splits)[0].members == {"train": ["t1"], "validation": ["v1"]}


def test_d2_near_duplicates_of_short_texts_use_character_shingles():
    splits = {
        "train": [ex("t1", "Thank you!"), ex("t2", "ok")],
        "validation": [ex("v1", "thank you"), ex("v2", "Thanks you"), ex("v3", "OK...")],
    }
    pairs = near_duplicates(splits, threshold=0.8)
    got = {(p.ids_a[0], p.ids_b[0]): p.jaccard for p in pairs}
    # "thank you!" and "thank you" are the same words: Jaccard 1; "ok" vs "ok...": 1.
    assert got == {("t1", "v1"): 1.0, ("t2", "v3"): 1.0}
    assert jaccard("Thank you", "Thanks you") == 0.5  # 5 shared 3-grams of 10: not reported


def test_d2_every_copy_of_a_text_is_named_on_both_sides():
    near = LONG.replace("soon", "today")
    splits = {
        "train": [ex("t1", LONG), ex("t2", LONG + " "), ex("t3", "x y z w")],
        "test": [ex("s1", near), ex("s2", near.upper())],
    }
    (pair,) = near_duplicates(splits)
    assert pair.ids_a == ["t1", "t2"] and pair.ids_b == ["s1", "s2"]


def _random_corpus(seed: int) -> dict[str, list[Example]]:
    """600 random texts over a 300-word vocabulary plus 40 planted near copies."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(300)]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(8, 20))) for _ in range(600)]
    rows = [ex(f"r{i}", t) for i, t in enumerate(texts)]
    for j in range(40):  # planted copies with one word changed or added
        words = texts[j].split()
        if j % 2:
            words[rng.randrange(len(words))] = "planted"
        else:
            words.append("extra")
        rows.append(ex(f"p{j}", " ".join(words)))
    rng.shuffle(rows)
    return {"train": rows[:450], "validation": rows[450:550], "test": rows[550:]}


def test_d2_near_duplicates_match_a_brute_force_search():
    """Every cross-split pair whose reference Jaccard is >= 0.8 is found, and nothing else
    (the planted pairs sit at 0.82-0.95, where LSH recall is above 0.999)."""
    splits = _random_corpus(3)
    order = ["train", "validation", "test"]
    truth = set()
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            for x in splits[a]:
                for y in splits[b]:
                    if (
                        normalize_text(x.text) != normalize_text(y.text)
                        and jaccard(x.text, y.text) >= 0.8
                    ):
                        truth.add((x.id, y.id))
    found = {(p.ids_a[0], p.ids_b[0]) for p in near_duplicates(splits)}
    assert len(truth) >= 5
    assert found == truth


def test_d2_lsh_banding_reaches_its_recall_at_the_threshold():
    for threshold, perms in [(0.8, 128), (0.8, 64), (0.5, 128), (0.95, 128)]:
        bands, rows = lsh_bands(threshold, perms)
        assert bands * rows <= perms
        assert 1 - (1 - threshold**rows) ** bands >= 0.99
        # one more row per band would miss the recall target: the banding is the tightest
        more = rows + 1
        assert 1 - (1 - threshold**more) ** (perms // more) < 0.99


def test_d2_results_do_not_depend_on_the_process_hash_seed(tmp_path):
    """blake2b and fixed seeds, never Python's salted hash(): two processes, same pairs."""
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from test_dedup import _random_corpus\n"
        "from tunepilot.data.audit.dedup import near_duplicates\n"
        "splits = _random_corpus(5)\n"
        "print(json.dumps([[p.ids_a, p.ids_b, p.jaccard] for p in near_duplicates(splits)]))\n"
    )
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, env=env, check=True
        )
        outputs.append(json.loads(run.stdout))
    assert outputs[0] == outputs[1] and len(outputs[0]) > 0


def test_d2_planted_duplicates_are_all_found_in_the_benchmark_data():
    """The benchmark's generator at 20,000 texts: every planted copy is found, nothing else."""
    spec = importlib.util.spec_from_file_location(
        "bench_audit", REPO / "benchmarks" / "bench_audit.py"
    )
    bench = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(bench)
    splits = bench.generate(20_000, planted_exact=60, planted_near=60)
    index = build_index(splits)
    groups = exact_duplicates(splits, index=index)
    assert sum(g.cross_split for g in groups) == 60
    pairs = near_duplicates(splits, index=index)
    assert len(pairs) == 60
    assert all(p.split_a == "train" and p.split_b in ("validation", "test") for p in pairs)
    assert all(0.8 <= p.jaccard < 1 for p in pairs)


def test_d2_dedup_modules_do_not_import_torch():
    code = (
        "import sys, tunepilot.data.audit.dedup, tunepilot.data.audit.run, tunepilot.demo.tickets; "
        "print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules) or "
        "'datasketch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
