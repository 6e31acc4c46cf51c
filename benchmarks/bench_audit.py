"""How long the D2 duplicate audit takes on a million short texts, and whether it finds what
was planted.

    .venv/bin/python benchmarks/bench_audit.py [--n 1000000] [--num-perm 128]

Texts are templated support sentences whose every word 3-gram holds at least one random word,
so two generated texts are unrelated unless planted. Into an 80/10/10 split we plant exact
copies of training texts in validation and test (with case and whitespace changes that the
normalisation must see through) and near copies (the last word replaced: Jaccard 0.82-0.85).
Only the audit (index, exact groups, near pairs) is timed; generating the data is not.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tunepilot.data.audit.dedup import build_index, exact_duplicates, near_duplicates
from tunepilot.tasks.example import Example

# "{}" marks a random word; never more than two fixed words in a row.
TEMPLATES = [
    "my {} was charged twice {} {} for order {} please {} refund the {} {} today {}",
    "the {} {} never arrived and {} tracking {} shows {} {} since {} last {}",
    "i want to {} return the {} {} because {} it is {} {} and {} broken {}",
    "the {} app crashes {} when i {} open {} the {} {} settings {} page {}",
    "please {} reset the {} password {} for {} my account {} {} email {} now {}",
    "someone {} used my {} card {} at {} a {} {} shop in {} the {} city {}",
    "can {} you {} change the {} delivery {} address {} to {} {} street {}",
    "i {} was {} billed {} for {} a {} plan i {} cancelled {} in {}",
]


def make_vocab(rng: np.random.Generator, size: int) -> list[str]:
    """Pronounceable pseudo-words, distinct, deterministic from the generator."""
    syll = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]
    words: set[str] = set()
    while len(words) < size:
        parts = rng.integers(0, len(syll), size=(size, 3))
        words.update("".join(syll[p] for p in row) for row in parts.tolist())
    return sorted(words)[:size]


def generate(n: int, planted_exact: int, planted_near: int, seed: int = 0):
    """(splits, planted exact groups, planted near pairs) for n texts split 80/10/10."""
    rng = np.random.default_rng(seed)
    vocab = make_vocab(rng, 5000)
    slots = max(t.count("{}") for t in TEMPLATES)
    tpl = rng.integers(0, len(TEMPLATES), size=n).tolist()
    words = rng.integers(0, len(vocab), size=(n, slots)).tolist()
    texts = [
        TEMPLATES[t].format(*(vocab[w] for w in row)) for t, row in zip(tpl, words, strict=True)
    ]
    n_train, n_val = int(n * 0.8), int(n * 0.1)
    bounds = {
        "train": (0, n_train),
        "validation": (n_train, n_train + n_val),
        "test": (n_train + n_val, n),
    }
    # Distinct training texts feed the plants, half of each kind to validation, half to test.
    donors = rng.choice(n_train, size=planted_exact + planted_near, replace=False).tolist()
    eval_slots = np.concatenate(
        [
            rng.choice(
                np.arange(*bounds["validation"]),
                size=(planted_exact + planted_near) // 2,
                replace=False,
            ),
            rng.choice(
                np.arange(*bounds["test"]),
                size=(planted_exact + planted_near + 1) // 2,
                replace=False,
            ),
        ]
    )
    rng.shuffle(eval_slots)
    for k, (donor, slot) in enumerate(zip(donors, eval_slots.tolist(), strict=True)):
        if k < planted_exact:
            texts[slot] = "  " + texts[donor].upper().replace(" ", "   ") + "\n"
        else:
            head, _, last = texts[donor].rpartition(" ")
            other = vocab[(vocab.index(last) + 1) % len(vocab)]
            texts[slot] = f"{head} {other}"
    splits = {
        name: [
            Example(id=f"{name[0]}{i}", text=texts[i], source=f"bench:{i}") for i in range(lo, hi)
        ]
        for name, (lo, hi) in bounds.items()
    }
    return splits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--planted-exact", type=int, default=2000)
    parser.add_argument("--planted-near", type=int, default=2000)
    parser.add_argument("--num-perm", type=int, default=128)
    args = parser.parse_args()

    t0 = time.perf_counter()
    splits = generate(args.n, args.planted_exact, args.planted_near)
    t_gen = time.perf_counter() - t0

    t0 = time.perf_counter()
    index = build_index(splits)
    t_index = time.perf_counter() - t0
    groups = exact_duplicates(splits, index=index)
    t_exact = time.perf_counter() - t0
    pairs = near_duplicates(splits, num_perm=args.num_perm, index=index)
    elapsed = time.perf_counter() - t0

    cross = sum(1 for g in groups if g.cross_split)
    print(
        f"generated in {t_gen:.1f} s; index {t_index:.1f} s, exact {t_exact - t_index:.1f} s, "
        f"near {elapsed - t_exact:.1f} s (num_perm {args.num_perm})"
    )
    print(
        f"audit over {args.n:,} texts: {elapsed:.1f} s (goal < 60 s); "
        f"exact cross-split groups: {cross} (planted {args.planted_exact}); "
        f"near pairs: {len(pairs)} (planted {args.planted_near})"
    )


if __name__ == "__main__":
    main()
