"""Exact and near-duplicate search across splits (D2).

A model evaluated on text it was trained on scores what it memorised, not what it learned, so
the audit looks for evaluation examples that repeat a training example:

- exactly, with the very key the `drop_exact_duplicates` cleaning rule uses
  (`clean.duplicate_key`: `normalize_text` of the text plus the context columns), so that the
  rule and the audit can never disagree;
- nearly: MinHash over word shingles, LSH banding to find candidate pairs, then the *exact*
  Jaccard of the two shingle sets decides. MinHash only proposes; it never reports a pair on
  an estimate.

Everything is plain Python + numpy and deterministic (fixed seeds, blake2b for strings, never
Python's salted `hash()`), so two runs over the same data report the same pairs. The
expensive parts are vectorised: shingle hashes are combined in numpy, every permutation is
three in-place uint64 operations plus `np.minimum.reduceat`, and banding is a sort.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tunepilot.data.clean import duplicate_key
from tunepilot.tasks.example import SPLITS, Splits

_WORD = re.compile(r"\w+")
_CHAR_GRAM = 3  # characters per shingle for texts with fewer words than the shingle size
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)
_MIX_MUL = np.uint64(0x9E3779B97F4A7C15)


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


@dataclass
class DuplicateGroup:
    """Examples whose texts are equal after normalisation, with their ids per split."""

    text: str  # the normalised text they share
    members: dict[str, list[str]]  # split -> example ids, in split order

    @property
    def cross_split(self) -> bool:
        """The same text sits in two splits: evaluation repeats training (or test repeats
        validation)."""
        return sum(1 for ids in self.members.values() if ids) > 1

    def within(self, split: str) -> bool:
        """The text repeats inside one split (over-weighted in training, or counted twice)."""
        return len(self.members.get(split, [])) > 1

    @property
    def size(self) -> int:
        return sum(len(ids) for ids in self.members.values())


@dataclass
class NearPair:
    """Two different normalised texts in two splits whose word-shingle sets overlap.

    `ids_a` are every example of `split_a` with `text_a` (usually one); same for b. `split_a`
    comes first in train / validation / test order, so b is the split that repeats a.
    """

    split_a: str
    split_b: str
    ids_a: list[str]
    ids_b: list[str]
    jaccard: float
    text_a: str
    text_b: str


# --------------------------------------------------------------------------------------------
# the shared index: every example mapped to its unique normalised text
# --------------------------------------------------------------------------------------------


@dataclass
class TextIndex:
    """Examples collapsed to unique normalised texts, built once and shared by both searches.

    Collapsing first keeps the near-duplicate search to distinct texts only (exact copies are
    reported as exact, never as near) and saves work on data with many repeats.
    """

    texts: list[str]  # unique duplicate keys (normalised text + "\x00" + context JSON)
    split_names: list[str]
    ids: dict[str, list[str]]  # split -> example ids in split order
    codes: dict[str, np.ndarray]  # split -> index into `texts` per example

    def shown(self, code: int) -> str:
        """The normalised text of a key, without its context part: what a report shows."""
        return self.texts[code].partition("\x00")[0]

    def split_mask(self) -> np.ndarray:
        """Per unique text, bit i set when the text occurs in split i."""
        mask = np.zeros(len(self.texts), dtype=np.uint8)
        for i, split in enumerate(self.split_names):
            if len(self.codes[split]):
                mask[np.unique(self.codes[split])] |= np.uint8(1 << i)
        return mask

    def members_of(self, wanted: Iterable[int]) -> dict[int, dict[str, list[str]]]:
        """Example ids per split for a few unique texts (sorted search, no per-text dicts)."""
        wanted_arr = np.array(sorted(set(wanted)), dtype=np.int64)
        out: dict[int, dict[str, list[str]]] = {int(c): {} for c in wanted_arr}
        for split in self.split_names:
            codes = self.codes[split]
            if not len(codes) or not len(wanted_arr):
                continue
            order = np.argsort(codes, kind="stable")
            ordered = codes[order]
            lo = np.searchsorted(ordered, wanted_arr, side="left")
            hi = np.searchsorted(ordered, wanted_arr, side="right")
            ids = self.ids[split]
            for code, start, stop in zip(
                wanted_arr.tolist(), lo.tolist(), hi.tolist(), strict=True
            ):
                if stop > start:
                    out[code][split] = [ids[j] for j in sorted(order[start:stop].tolist())]
        return out


def build_index(splits: Splits) -> TextIndex:
    """Key every example once (`duplicate_key`: normalised text + context) and number the
    distinct keys."""
    names = [s for s in SPLITS if s in splits] + sorted(s for s in splits if s not in SPLITS)
    seen: dict[str, int] = {}
    codes: dict[str, np.ndarray] = {}
    ids: dict[str, list[str]] = {}
    for split in names:
        examples = splits[split]
        ids[split] = [ex.id for ex in examples]
        codes[split] = np.fromiter(
            (seen.setdefault(duplicate_key(ex), len(seen)) for ex in examples),
            dtype=np.int64,
            count=len(examples),
        )
    return TextIndex(texts=list(seen), split_names=names, ids=ids, codes=codes)


# --------------------------------------------------------------------------------------------
# exact duplicates
# --------------------------------------------------------------------------------------------


def exact_duplicates(splits: Splits, index: TextIndex | None = None) -> list[DuplicateGroup]:
    """Every normalised text held by more than one example, with its members per split.

    Groups come in first-seen order (train first). A group can be within one split, across
    splits, or both; see `DuplicateGroup.cross_split` and `.within(split)`.
    """
    index = index or build_index(splits)
    if not index.texts:
        return []
    counts = np.zeros(len(index.texts), dtype=np.int64)
    for codes in index.codes.values():
        counts += np.bincount(codes, minlength=len(index.texts))
    repeated = np.flatnonzero(counts > 1)
    members = index.members_of(repeated.tolist())
    return [DuplicateGroup(index.shown(c), members[c]) for c in repeated.tolist()]


# --------------------------------------------------------------------------------------------
# near duplicates
# --------------------------------------------------------------------------------------------


def _stable_hash64(text: str) -> int:
    """A stable 64-bit hash of a string (blake2b), identical across processes and machines."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads the bits so combined shingle hashes look random."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@dataclass
class _Shingles:
    """Shingle hashes of every unique text, flat, with each text's [start, stop) range."""

    hashes: np.ndarray  # uint64
    starts: np.ndarray  # int64, per unique text
    counts: np.ndarray  # int64, per unique text (0: no word or character to compare)

    def of(self, code: int) -> set[int]:
        start = int(self.starts[code])
        return set(self.hashes[start : start + int(self.counts[code])].tolist())


def _shingle(texts: list[str], size: int) -> _Shingles:
    """Word `size`-grams of each text; character 3-grams for texts with fewer words.

    Words are `\\w+` runs of the normalised text, so punctuation alone never separates two
    texts ("Top up" vs "top-up"): such pairs come out as near duplicates with Jaccard 1.
    """
    vocab: dict[str, int] = {}
    word_ids: list[int] = []
    n_words = np.zeros(len(texts), dtype=np.int64)
    char_sets: dict[int, list[int]] = {}
    for i, text in enumerate(texts):
        words = _WORD.findall(text)
        if len(words) >= size:
            n_words[i] = len(words)
            word_ids.extend(vocab.setdefault(w, len(vocab)) for w in words)
        elif words:
            joined = " ".join(words)
            grams = {
                joined[j : j + _CHAR_GRAM] for j in range(max(1, len(joined) - _CHAR_GRAM + 1))
            }
            char_sets[i] = sorted(_stable_hash64("\x01" + g) for g in grams)

    word_hash = np.fromiter((_stable_hash64(w) for w in vocab), dtype=np.uint64, count=len(vocab))
    flat = word_hash[np.asarray(word_ids, dtype=np.int64)]
    # One shingle starts at each word that has `size - 1` words after it in the same text.
    n_word_shingles = np.where(n_words >= size, n_words - size + 1, 0)
    word_starts = np.concatenate(([0], np.cumsum(n_words)[:-1]))
    shingle_offsets = np.concatenate(([0], np.cumsum(n_word_shingles)[:-1]))
    total = int(n_word_shingles.sum())
    positions = np.repeat(word_starts, n_word_shingles) + (
        np.arange(total, dtype=np.int64) - np.repeat(shingle_offsets, n_word_shingles)
    )
    word_shingles = flat[positions] if total else np.zeros(0, dtype=np.uint64)
    for j in range(1, size):
        word_shingles = _mix64(word_shingles * _MIX_MUL + flat[positions + j])

    counts = n_word_shingles.copy()
    for i, grams in char_sets.items():
        counts[i] = len(grams)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    hashes = np.empty(int(counts.sum()), dtype=np.uint64)
    word_rows = n_word_shingles > 0
    # Word shingles go to their texts' slots in one scatter; the few char-gram texts after.
    dest = np.repeat(starts[word_rows], n_word_shingles[word_rows]) + (
        np.arange(total, dtype=np.int64)
        - np.repeat(shingle_offsets[word_rows], n_word_shingles[word_rows])
    )
    hashes[dest] = word_shingles
    for i, grams in char_sets.items():
        hashes[starts[i] : starts[i] + len(grams)] = np.array(grams, dtype=np.uint64)
    return _Shingles(hashes=hashes, starts=starts, counts=counts)


def lsh_bands(threshold: float, num_perm: int, recall: float = 0.99) -> tuple[int, int]:
    """(bands, rows) with the most rows per band that still proposes a pair of Jaccard
    `threshold` with probability >= `recall`. Candidates are verified exactly, so a false
    positive costs a set comparison while a false negative is a leak never reported."""
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if 1 - (1 - threshold**rows) ** bands >= recall:
            return bands, rows
    return num_perm, 1


def _band_keys(sh: _Shingles, active: np.ndarray, bands: int, rows: int, seed: int) -> np.ndarray:
    """One uint64 key per active text and band: a hash of its `rows` MinHash values.

    Hash family: multiply-add-shift, h(x) = ((a*x + b) mod 2^64) >> 32 on 32-bit shingle
    values, strongly universal and three in-place numpy ops per permutation.
    """
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**64, size=bands * rows, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**64, size=bands * rows, dtype=np.uint64)
    x = sh.hashes & _MASK32
    # reduceat over the active texts' starts: inactive texts own empty ranges, so each
    # segment between two active starts holds exactly one active text's shingles.
    starts = sh.starts[active]
    keys = np.zeros((bands, len(active)), dtype=np.uint64)
    buf = np.empty_like(x)
    for band in range(bands):
        key = np.zeros(len(active), dtype=np.uint64)
        for row in range(rows):
            p = band * rows + row
            np.multiply(x, a[p], out=buf)
            np.add(buf, b[p], out=buf)
            np.right_shift(buf, _SHIFT32, out=buf)
            key = _mix64(key * _MIX_MUL + np.minimum.reduceat(buf, starts))
        keys[band] = key
    return keys


def _pairs_in_runs(keys: np.ndarray) -> np.ndarray:
    """All (i, j) index pairs, i < j in sorted order, of entries that share a key: (n, 2)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    boundary = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    lengths = np.diff(np.concatenate((boundary, [len(keys)])))
    run_start = boundary[lengths > 1]
    run_len = lengths[lengths > 1]
    found: list[np.ndarray] = []
    for gap in range(1, int(run_len.max()) if len(run_len) else 1):
        live = run_len > gap
        per_run = run_len[live] - gap
        offsets = np.concatenate(([0], np.cumsum(per_run)[:-1]))
        first = np.repeat(run_start[live], per_run) + (
            np.arange(int(per_run.sum())) - np.repeat(offsets, per_run)
        )
        found.append(np.stack((order[first], order[first + gap]), axis=1))
    return np.concatenate(found) if found else np.zeros((0, 2), dtype=np.int64)


def near_duplicates(
    splits: Splits,
    threshold: float = 0.8,
    shingle_size: int = 3,
    num_perm: int = 128,
    seed: int = 1,
    index: TextIndex | None = None,
) -> list[NearPair]:
    """Pairs of distinct normalised texts in different splits with shingle Jaccard >=
    `threshold` (D2). Exact duplicates after normalisation are not repeated here.

    Only pairs that cross splits are verified and returned (train vs validation, train vs
    test, validation vs test); within-split near duplicates are legitimate data.
    """
    index = index or build_index(splits)
    if len(index.split_names) < 2 or not index.texts:
        return []
    mask = index.split_mask()
    sh = _shingle(index.texts, shingle_size)
    # Texts seen in a single split with no other text to pair with still get signatures:
    # their partner may live in another split.
    active = np.flatnonzero(sh.counts > 0)
    if len(active) < 2:
        return []
    bands, rows = lsh_bands(threshold, num_perm)
    keys = _band_keys(sh, active, bands, rows, seed)

    codes: list[np.ndarray] = []
    n = np.uint64(len(index.texts))
    single = np.isin(mask, [1, 2, 4, 8, 16, 32, 64, 128])
    for band in range(bands):
        pairs = active[_pairs_in_runs(keys[band])]
        if not len(pairs):
            continue
        u, v = pairs.min(axis=1), pairs.max(axis=1)
        # Two texts can only form a cross-split pair unless both sit in the same one split.
        crosses = ~((mask[u] == mask[v]) & single[u])
        codes.append(u[crosses].astype(np.uint64) * n + v[crosses].astype(np.uint64))
    if not codes:
        return []
    candidates = np.unique(np.concatenate(codes))

    verified: list[tuple[int, int, float]] = []
    cache: dict[int, set[int]] = {}
    for code in candidates.tolist():
        u, v = divmod(code, len(index.texts))
        for code_ in (u, v):
            if code_ not in cache:
                cache[code_] = sh.of(code_)
        set_u, set_v = cache[u], cache[v]
        jac = len(set_u & set_v) / len(set_u | set_v)
        if jac >= threshold - 1e-12:
            verified.append((u, v, jac))
    return _expand(index, mask, verified)


def _expand(
    index: TextIndex, mask: np.ndarray, verified: list[tuple[int, int, float]]
) -> list[NearPair]:
    """Turn text pairs into per-split-pair NearPairs with the example ids on each side."""
    members = index.members_of([c for u, v, _ in verified for c in (u, v)])
    names = index.split_names
    out: list[tuple[tuple[int, int, int, int], NearPair]] = []
    for u, v, jac in verified:
        for i, split_a in enumerate(names):
            for j in range(i + 1, len(names)):
                split_b = names[j]
                for first, second in ((u, v), (v, u)):
                    if mask[first] >> i & 1 and mask[second] >> j & 1:
                        pair = NearPair(
                            split_a=split_a,
                            split_b=split_b,
                            ids_a=members[first][split_a],
                            ids_b=members[second][split_b],
                            jaccard=round(jac, 4),
                            text_a=index.shown(first),
                            text_b=index.shown(second),
                        )
                        out.append(((i, j, first, second), pair))
    out.sort(key=lambda item: item[0])
    return [pair for _, pair in out]
