"""Special tokens as the program really writes them (D3, D5): none doubled at a boundary.

A prompt template (or a chat template) that writes `<s>` itself, fed to a tokenizer that adds
its own BOS, starts every prompt with two: the model was pretrained on one, and every
training and evaluation input now opens on a sequence it never saw. An answer column that
already ends with `</s>` gets a second EOS from the encoder, which appends one: the model is
trained to emit two, and generation stops at the first. Both are silent: the loss stays
finite and the curve goes down. The check reads the token ids the encoder really produced,
for training (the whole example) and for evaluation (the prompt generation starts from).
"""

from __future__ import annotations

from typing import Any

from tunepilot.data.audit.labels import FAIL, PASS, SHOWN, WARN, _order
from tunepilot.errors import InputError
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.tasks.example import Splits
from tunepilot.verdict import Finding

PROMPTS_CHECKED = 50  # evaluation prompts rendered per split (the template is the same for all)


class EncodingMemo:
    """The audit's encoder, each example encoded once for every check that reads it (the
    length check, the turn-end check, this one); an encoding error is kept and raised again."""

    def __init__(self, encoder: Any) -> None:
        self._encoder = encoder
        self._done: dict[str, Any] = {}

    def encode(self, example: Any) -> Any:
        if example.id not in self._done:
            try:
                self._done[example.id] = self._encoder.encode(example)
            except InputError as exc:
                self._done[example.id] = exc
        found = self._done[example.id]
        if isinstance(found, InputError):
            raise found
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._encoder, name)


def _doubled_start(ids: list[int], special: set[int]) -> int | None:
    return ids[0] if len(ids) > 1 and ids[0] == ids[1] and ids[0] in special else None


def _doubled_ends(ids: list[int], labels: list[int], special: set[int]) -> list[int]:
    """Special tokens that close a loss span twice in a row (`... </s></s>`)."""
    out = []
    for k in range(1, len(labels)):
        span_ends = k + 1 == len(labels) or labels[k + 1] == IGNORE_INDEX
        if labels[k] != IGNORE_INDEX and span_ends and ids[k] == ids[k - 1] in special:
            out.append(ids[k])
    return out


def check_special_tokens(splits: Splits, encoder: Any) -> Finding:
    """D3/D5: a BOS (or any special token) twice at the start of a training input or an
    evaluation prompt, or an EOS (any special token) twice at the end of a trained answer."""
    check = "special tokens written once"
    tokenizer = getattr(encoder, "tokenizer", None)
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    if not special:
        return Finding(check, WARN, "cannot validate: the tokenizer names no special tokens", "D3")
    starts: list[tuple[str, str, int]] = []  # (id, "training input" | "evaluation prompt", token)
    ends: list[tuple[str, int]] = []
    checked = 0
    for split in _order(splits):
        for n, ex in enumerate(splits[split]):
            try:
                enc = encoder.encode(ex)
            except InputError:
                continue  # the length check FAILs naming rows that cannot be encoded
            checked += 1
            if (tok := _doubled_start(enc.input_ids, special)) is not None:
                starts.append((ex.id, "training input", tok))
            if encoder.kind == "causal_lm":
                ends += [(ex.id, t) for t in _doubled_ends(enc.input_ids, enc.labels, special)]
                if n < PROMPTS_CHECKED:
                    prompt = encoder.prompt_ids(ex)
                    if (tok := _doubled_start(prompt, special)) is not None:
                        starts.append((ex.id, "evaluation prompt", tok))
    if not checked:
        return Finding(check, WARN, "cannot validate: no example encodes", "D3")
    if not starts and not ends:
        sentence = (f"no special token is doubled at the start of an input or prompt, or at the "
                    f"end of an answer ({checked} examples encoded)")  # fmt: skip
        return Finding(check, PASS, sentence, "D3, D5")

    def name(token: int) -> str:
        return repr(tokenizer.convert_ids_to_tokens(token))

    parts = []
    if starts:
        where = [w for w in ("training input", "evaluation prompt")
                 if any(w == x for _, x, _ in starts)]  # fmt: skip
        rows = list(dict.fromkeys(i for i, _, _ in starts))
        parts.append(
            f"{len(rows)} examples start with {name(starts[0][2])} twice "
            f"(in the {' and the '.join(where)}, e.g. {', '.join(rows[:3])}):"
            f" the template writes it and the tokenizer adds it again; remove "
            f"{name(starts[0][2])} from data.template (or the chat template, or the text)"
        )
    if ends:
        parts.append(
            f"{len({i for i, _ in ends})} answers end with {name(ends[0][1])} twice (e.g. "
            f"{', '.join(i for i, _ in ends[:3])}): the answer text already holds it and the "
            f"encoder appends it; strip {name(ends[0][1])} from the answers (data.fields.target)"
        )
    sentence = "; ".join(parts) + ": the model trains on a sequence it was never built for"
    details = {"doubled_start": [list(s) for s in starts[:50]],
               "doubled_end": [list(e) for e in ends[:50]], "checked": checked}  # fmt: skip
    ids = list(dict.fromkeys([i for i, _, _ in starts] + [i for i, _ in ends]))[:SHOWN]
    return Finding(check, FAIL, sentence, "D3, D5", examples=ids, details=details)
