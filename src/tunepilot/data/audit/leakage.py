"""Target leakage in the input (D2, D5): the answer is already written where the model reads.

A model scores well on rows whose answer it can copy: a class name written into the text it
labels (`... [refund]`), the JSON answer pasted into the prompt, an assistant turn that
repeats a user turn of the same conversation. It then learns to copy, and fails on inputs that
do not carry the answer. The share of such rows is reported per split, and the check FAILs
above `data.audit.target_leak_share` (raise it for a task whose answer is a rewrite of the
input, such as spelling correction).

The rules, checkable by hand:

* classification: the class name, split into words (`card_arrival`, `CardArrival` and
  `card arrival` are the words "card arrival"), occurs as consecutive words of the text, each
  word equal up to a plural `s` or one typo (words of 5+ letters), or written as one word;
  names of digits only or under 3 characters are not searched;
* generation: at least COPIED_SHARE of the answer's words occur as one unbroken run of words
  in the input (the text and its context fields, or for a conversation every turn before the
  answer); for extraction the run must also hold every top-level field name, since copying
  values out of the text is the task itself.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from tunepilot.campaign import CLASSIFICATION_TASKS
from tunepilot.data.audit.labels import FAIL, PASS, SHOWN, _noun, _order
from tunepilot.data.normalize import normalize_text
from tunepilot.tasks.example import Example, Splits
from tunepilot.verdict import Finding

COPIED_SHARE = 0.8  # of the answer's words in one run of the input: the answer is in it
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_ALNUM = re.compile(r"[^\W_]+")
_WORD = re.compile(r"\w+")


def name_words(name: str) -> list[str]:
    """A class name as lowercase words: snake, kebab, camel case and spaces all split."""
    return _ALNUM.findall(_CAMEL.sub(" ", name).casefold())


def _close(a: str, b: str) -> bool:
    """Equal up to a plural `s`/`es`, or one edit for words of 5+ letters."""
    if a == b or a.removesuffix("s") == b.removesuffix("s"):
        return True
    if a.removesuffix("es") == b.removesuffix("es"):
        return True
    if min(len(a), len(b)) < 5 or abs(len(a) - len(b)) > 1:
        return False
    return difflib.SequenceMatcher(None, a, b).ratio() >= 1 - 2 / (len(a) + len(b)) - 1e-9


def mentions(text_words: list[str], label: list[str]) -> bool:
    """The label's words as consecutive words of the text, or the label written as one word."""
    n = len(label)
    for i in range(len(text_words) - n + 1):
        if all(_close(w, x) for w, x in zip(text_words[i : i + n], label, strict=True)):
            return True
    joined = "".join(label)
    return n > 1 and any(_close(w, joined) for w in text_words if len(w) >= len(joined) - 1)


def _searchable(name: str) -> bool:
    return len(name.strip()) >= 3 and not name.strip().isdigit()


def copied(answer: list[str], source: list[str], keys: list[str] | None = None) -> bool:
    """At least COPIED_SHARE of `answer`'s words as one run of `source`'s words (holding every
    word of `keys` when given)."""
    if not answer or not source:
        return False
    present = set(source)
    if sum(w in present for w in answer) < COPIED_SHARE * len(answer):
        return False  # cheap test first: most rows stop here
    match = difflib.SequenceMatcher(None, answer, source, autojunk=False).find_longest_match()
    if match.size < COPIED_SHARE * len(answer):
        return False
    run = set(answer[match.a : match.a + match.size])
    return keys is None or all(k in run for k in keys)


def _words(text: str) -> list[str]:
    return _WORD.findall(normalize_text(text))


def _answer_in_input(ex: Example, task: str, answer_turns: str) -> bool:
    """Whether one generation row carries its answer in its input (see the module doc)."""
    if ex.messages is not None:
        turns = ex.messages
        answers = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
        scored = answers[-1:] if answer_turns == "last" else answers
        return any(copied(_words(turns[i]["content"]),
                          [w for t in turns[:i] for w in _words(t["content"])])
                   for i in scored)  # fmt: skip
    source = _words(" ".join([ex.text, *(str(v) for v in ex.context.values())]))
    target = ex.target
    if target is None:
        return False
    if task == "extraction" and isinstance(target, dict):
        import json

        keys = [w for k in target for w in _words(str(k))]
        return copied(_words(json.dumps(target, ensure_ascii=False)), source, keys)
    return copied(_words(target if isinstance(target, str) else str(target)), source)


def check_target_leakage(
    splits: Splits, task: str, share: float, answer_turns: str = "last"
) -> Finding:
    """D2/D5: rows whose input already holds their answer, per split; FAIL above `share`
    (data.audit.target_leak_share) in any split."""
    check = "answer written in the input"
    classify = task in CLASSIFICATION_TASKS
    if task == "image_classification":
        return Finding(check, PASS, "images: the input is pixels, no text to search", "D2")
    hits: dict[str, list[Example]] = {}
    skipped: set[str] = set()
    for split in _order(splits):
        found = []
        for ex in splits[split]:
            if classify:
                if ex.label is None or not _searchable(ex.label):
                    skipped.update([ex.label] if ex.label else [])
                    continue
                leak = mentions(_words(ex.text), name_words(ex.label))
            else:
                leak = _answer_in_input(ex, task, answer_turns)
            if leak:
                found.append(ex)
        hits[split] = found
    shares = {s: len(hits[s]) / len(splits[s]) for s in _order(splits)}
    seen = ", ".join(f"{_noun(s)} {len(hits[s])}/{len(splits[s])} ({shares[s]:.1%})"
                     for s in shares)  # fmt: skip
    what = ("rows whose text names their own class" if classify
            else "rows whose answer is written in their input")
    details: dict[str, Any] = {"per_split": {s: len(h) for s, h in hits.items()},
                               "share_per_split": {s: round(v, 4) for s, v in shares.items()},
                               "fail_share": share, "not_searched": sorted(skipped)[:20]}
    flagged = [ex for s in hits for ex in hits[s]]
    details["examples"] = [{"id": ex.id, "source": ex.source,
                            **({"label": ex.label} if classify else {})}
                           for ex in flagged[:50]]  # fmt: skip
    over = {s: v for s, v in shares.items() if v > share}
    if not over:
        sentence = f"{what}: {seen}, within data.audit.target_leak_share {share:.0%}"
        return Finding(check, PASS, sentence, "D2, D5", examples=[e.id for e in flagged[:SHOWN]],
                       details=details)  # fmt: skip
    shown = "; ".join(
        (f"{ex.source} labelled {ex.label!r}" if classify else ex.source) for ex in flagged[:3]
    )
    fix = ("remove the class names from the texts (a tag, a prefix, a column pasted in)"
           if classify else
           "remove the answers from the prompts and earlier turns (a pasted answer column, a "
           "turn repeated)")  # fmt: skip
    sentence = (
        f"{what}: {seen}, above data.audit.target_leak_share {share:.0%} (e.g. {shown}): the "
        f"model learns to copy the answer and fails on inputs without it; {fix}, or raise "
        "data.audit.target_leak_share if copying is the task"
    )
    return Finding(check, FAIL, sentence, "D2, D5", examples=[e.id for e in flagged[:SHOWN]],
                   details=details)
