"""Training rows built like evaluation rows (D3, D5): the same system prompt, the same
template parts, in every split.

A validation file exported by another script than the training file (no system prompt, an
`### Instruction:` header written only in training, a prefix added to the answers) scores the
model on inputs it was never trained on: the drop looks like a weak model, not a pipeline
difference. Parts that nearly every row of one split has are compared with the other splits:

* for a conversation: whether it has a system turn, each frequent system prompt, and the first
  and last words of its first user turn and of its assistant turns;
* for a prompt/answer row: the first and last words of its text and of its answer.

A part held by at least FREQUENT of the rows of one split whose share in another split differs
by SPLIT_GAP or more is a FAIL naming the part, both shares and a row of each. Words are
whitespace-separated and lowercased, so `### Instruction:` is two words; a run of words is a
part only when the text has more words than it (a whole short answer is a label, not a part
of a template).
"""

from __future__ import annotations

import json
from typing import Any

from tunepilot.data.audit.labels import FAIL, PASS, SHOWN, _noun, _order
from tunepilot.tasks.example import Example, Splits
from tunepilot.verdict import Finding

FREQUENT = 0.6  # a part held by this share of a split's rows is how that split is built
SPLIT_GAP = 0.5  # ...and another split holding it this much less (or more) is built otherwise
EDGE_WORDS = 4  # leading / trailing word runs of 1..EDGE_WORDS words are compared
MIN_ROWS = 5  # a split this small says nothing about how it was built


Part = tuple[str, str, str]
"""(where, how, words): ("the first user turn", "begins", "### instruction:"), or
("a system turn", "", "")."""


def _edges(where: str, text: str) -> set[Part]:
    words = text.lower().split()
    out = set()
    for k in range(1, min(EDGE_WORDS, len(words) - 1) + 1):  # a part, never the whole text
        out.add((where, "begins", " ".join(words[:k])))
        out.add((where, "ends", " ".join(words[-k:])))
    return out


def part_text(part: Part) -> str:
    where, how, words = part
    if how == "is":
        return f"{where} `{words[:80]}`"
    return f"{where} {how} `{words}`" if how else where


def row_parts(ex: Example) -> set[Part]:
    """The parts of one row that show how it was built (see the module docstring)."""
    if ex.messages is None:
        answer = ex.target if isinstance(ex.target, str) or ex.target is None else json.dumps(
            ex.target, ensure_ascii=False)  # fmt: skip
        return _edges("the text", ex.text) | (_edges("the answer", answer) if answer else set())
    turns = ex.messages
    system = [t["content"] for t in turns if t["role"] == "system"]
    parts: set[Part] = {("a system turn", "", "")} if system else set()
    parts |= {("the system prompt", "is", " ".join(s.split())) for s in system}
    user = next((t["content"] for t in turns if t["role"] == "user"), None)
    if user is not None:
        parts |= _edges("the first user turn", user)
    for t in turns:
        if t["role"] == "assistant":
            parts |= _edges("an assistant turn", t["content"])
    return parts


def check_rows_built_alike(splits: Splits) -> Finding:
    """D3/D5: a part frequent in one split and rare in another (see the module docstring)."""
    check = "rows built alike in every split"
    order = [s for s in _order(splits) if len(splits[s]) >= MIN_ROWS]
    if len(order) < 2:
        return Finding(check, PASS, "one split only (or splits under 5 rows): nothing to "
                       "compare", "D3")  # fmt: skip
    holders: dict[str, dict[Part, list[str]]] = {}
    for split in order:
        seen: dict[Part, list[str]] = {}
        for ex in splits[split]:
            for part in row_parts(ex):
                seen.setdefault(part, []).append(ex.id)
        holders[split] = seen
    share = {s: {p: len(ids) / len(splits[s]) for p, ids in holders[s].items()} for s in order}
    first = order[0]
    differ: list[dict[str, Any]] = []
    for other in order[1:]:
        for a, b in ((first, other), (other, first)):
            for part, value in share[a].items():
                there = share[b].get(part, 0.0)
                if value >= FREQUENT and value - there >= SPLIT_GAP:
                    differ.append({"part": part_text(part), "key": part, "in": a,
                                   "share": round(value, 4), "other": b,
                                   "other_share": round(there, 4),
                                   "example": holders[a][part][0],
                                   "other_example": _without(splits[b], holders[b], part)})
    differ = _longest(differ)
    if not differ:
        n = sum(1 for s in order for v in share[s].values() if v >= FREQUENT)
        sentence = (f"every part shared by {FREQUENT:.0%} of a split's rows ({n} in all: system "
                    f"prompts, template words) has a like share in the other splits")  # fmt: skip
        return Finding(check, PASS, sentence, "D3, D5")
    shown = "; ".join(
        f"{d['part']} in {d['share']:.0%} of {_noun(d['in'])} rows (e.g. {d['example']}) but "
        f"{d['other_share']:.0%} of {_noun(d['other'])} rows (e.g. {d['other_example']})"
        for d in differ[:3]
    )
    sentence = (
        f"the splits are built differently: {shown}; the model is scored on inputs unlike the "
        "ones it trained on: build every split with the same script (same system prompt and "
        "template), or strip the part from the split that has it"
    )
    ids = [i for d in differ[:3] for i in (d["example"], d["other_example"]) if i][:SHOWN]
    return Finding(check, FAIL, sentence, "D3, D5", examples=ids,
                   details={"parts": differ[:50]})  # fmt: skip


def _without(examples: list[Example], holders: dict[Part, list[str]], part: Part) -> str:
    have = set(holders.get(part, []))
    return next((ex.id for ex in examples if ex.id not in have), "")


def _longest(differ: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per difference: `begins "### instruction:"` stands for `begins "###"`."""
    best: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for d in differ:
        where, how, words = d.pop("key")
        family = (d["in"], d["other"], where, how if how != "is" else words)
        if family not in best or len(words) > len(best[family]["words"]):
            best[family] = {**d, "words": words}
    kept = [{k: v for k, v in d.items() if k != "words"} for d in best.values()]
    return sorted(kept, key=lambda d: (-abs(d["share"] - d["other_share"]), d["part"]))
