"""`data show`: a few examples after the program's exact preprocessing, for a person to check.

D3: the tokens the model receives (special tokens visible), the separators between them, where
truncation cut, and which positions carry the loss. D4: K representative examples per class
with their expected target. The samples come from the same `encoder.encode` that training
uses, never from a re-implementation, so what is shown is what is trained.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tunepilot.errors import InputError, Problem
from tunepilot.tasks.base import IGNORE_INDEX
from tunepilot.tasks.example import Example

NEWLINE, TAB, SPACE, SEPARATOR, SCISSORS = "⏎", "⇥", "␣", "|", "✂"
LOSS_OPEN, LOSS_CLOSE = "⟦", "⟧"
"""Around each run of loss positions where there is no colour to show them (a pipe, a log, the
pilot's samples.txt): the loss positions are what a person must check (D3, D5)."""


@dataclass
class Sample:
    """One example as encoded: tokens with their loss flag, truncation and expected target."""

    id: str
    source: str
    kind: str
    expected: str
    tokens: list[dict[str, Any]]
    truncated: bool
    truncation_point: int | None
    full_length: int
    n_loss_tokens: int
    label: str | None = None
    loss_on_label: str | None = None
    target_truncated: bool = False
    notes: list[str] = field(default_factory=list)
    loss_positions_from: str | None = None  # chat: "generation tags" or "prefix diff"


def pick_examples(
    examples: list[Example], n: int = 3, per_class: int = 0, label_order: list[str] | None = None
) -> list[Example]:
    """The first `n` examples, or the first `per_class` of each class in id order (D4).

    Classes come in `label_order` (the id order) when given, else sorted by name; a class
    with fewer examples shows all it has.
    """
    if per_class <= 0:
        return examples[:n]
    labelled = [e for e in examples if e.label is not None]
    if not labelled:
        raise InputError(
            [
                Problem(
                    "data.fields.label",
                    "these examples have no class labels",
                    "set data.fields.label to show examples per class, or use --n",
                )
            ],
            title="no classes to sample",
        )
    names = list(label_order or [])
    names += sorted({e.label for e in labelled} - set(names))  # type: ignore[arg-type]
    picked: list[Example] = []
    for name in names:
        members = sorted((e for e in labelled if e.label == name), key=lambda e: e.id)
        picked += members[:per_class]
    return picked


def render_samples(
    encoder: Any, tokenizer: Any, examples: list[Example], n: int = 3, per_class: int = 0
) -> list[Sample]:
    """Encode the chosen examples with `encoder` and lay out every token with its loss flag."""
    order = getattr(encoder, "label_names", None)
    samples = []
    for example in pick_examples(examples, n=n, per_class=per_class, label_order=order):
        enc = encoder.encode(example)
        classification = encoder.kind == "classification"
        tokens = [
            {
                "token": tokenizer.decode([tid], skip_special_tokens=False),
                "id": tid,
                "loss": (not classification) and label != IGNORE_INDEX,
            }
            for tid, label in zip(
                enc.input_ids,
                enc.labels if not classification else [IGNORE_INDEX] * len(enc.input_ids),
                strict=True,
            )
        ]
        expected = encoder.expected_target(example)
        notes = []
        if enc.cut_turns:
            turns = ", ".join(map(str, enc.cut_turns))
            notes.append(f"max_length cut assistant turn(s) {turns}: trained without their end")
        elif enc.target_truncated:
            notes.append("max_length cut answer tokens: the model never sees the whole answer")
        if enc.loss_tokens == 0:
            notes.append("no position carries loss: this example teaches nothing")

        samples.append(
            Sample(
                id=example.id,
                source=example.source,
                kind=encoder.kind,
                expected=expected,
                tokens=tokens,
                truncated=enc.truncated,
                truncation_point=len(enc.input_ids) if enc.truncated else None,
                full_length=enc.full_length,
                n_loss_tokens=enc.loss_tokens,
                label=example.label,
                loss_on_label=expected if classification else None,
                target_truncated=enc.target_truncated,
                notes=notes,
                loss_positions_from=getattr(encoder, "mask_method", None),
            )
        )
    return samples


def samples_to_json(samples: list[Sample]) -> list[dict[str, Any]]:
    """JSON-ready samples (`data show --json`)."""
    return [asdict(s) for s in samples]


def visible(piece: str) -> str:
    """A token piece with its whitespace made visible, so separators cannot hide."""
    return piece.replace("\n", NEWLINE).replace("\t", TAB).replace(" ", SPACE)


def sample_text(sample: Sample, width: int | None = None, marked: bool = False) -> Any:
    """One sample as a Rich Text: `|` between tokens, loss positions bold green underlined
    (and inside ⟦ ⟧ when `marked`, for output without colour), `✂` where max_length cut.

    With `width`, lines break between tokens only, never inside one (`</s>` stays whole)."""
    from rich.cells import cell_len
    from rich.text import Text

    pieces: list[tuple[str, str]] = []
    flags = [tok["loss"] for tok in sample.tokens]
    for i, tok in enumerate(sample.tokens):
        piece = visible(tok["token"])
        if marked and tok["loss"]:
            piece = (LOSS_OPEN if i == 0 or not flags[i - 1] else "") + piece + (
                LOSS_CLOSE if i + 1 == len(flags) or not flags[i + 1] else "")  # fmt: skip
        pieces.append((piece, "bold green underline" if tok["loss"] else ""))
    text, used = Text(), 0
    for i, (piece, style) in enumerate(pieces):
        cost = cell_len(piece) + (1 if i else 0)
        if width and used and used + cost > width:
            text.append("\n")
            used, cost = 0, cost - 1
        elif i:
            text.append(SEPARATOR, style="dim")
        if i and used == 0:
            text.append(SEPARATOR, style="dim")  # a line starts with the separator it broke at
            cost += 1
        text.append(piece, style=style)
        used += cost
    if sample.truncation_point is not None:
        cut = sample.full_length - sample.truncation_point
        text.append(f" {SCISSORS} ", style="bold red")
        text.append(f"({cut} more token(s) cut by max_length)", style="red")
    return text


def print_samples(samples: list[Sample], console: Any) -> None:
    """Print samples for a person to check (D3, D4); without colour (a pipe, a file) the loss
    positions are bracketed instead."""
    from rich.text import Text

    marked = console.color_system is None
    for s in samples:
        head = Text(f"{s.id}", style="bold")
        head.append(f"  ({s.source})  {len(s.tokens)} tokens", style="dim")
        if s.label is not None:
            head.append(f"  class {s.label}", style="cyan")
        console.print(head)
        console.print(sample_text(s, console.width, marked), soft_wrap=True)
        if s.loss_on_label is not None:
            console.print(
                Text(f"loss on label: {s.loss_on_label}", style="bold green"),
                Text("(no token carries loss; the head predicts the class)", style="dim"),
            )
        else:
            shown = f"inside {LOSS_OPEN} {LOSS_CLOSE}" if marked else "bold green, underlined"
            console.print(Text(f"loss on {s.n_loss_tokens} token(s) ({shown})", style="green"))
            if s.loss_positions_from:
                console.print(
                    Text(f"loss positions from the chat template ({s.loss_positions_from})",
                         style="dim")  # fmt: skip
                )
            said = "expected (the last assistant turn, what evaluation scores): " if (
                s.loss_positions_from) else "expected: "  # fmt: skip
            console.print(Text(said, style="bold") + Text(s.expected))
        for note in s.notes:
            console.print(Text(f"WARN: {note}", style="yellow"))
        console.print()
    if samples:
        console.print(
            Text(
                f"{SEPARATOR} separates tokens, {NEWLINE} newline, {SPACE} space, "
                f"{TAB} tab, {SCISSORS} truncation point"
                + (f", {LOSS_OPEN}...{LOSS_CLOSE} loss positions" if marked else ""),
                style="dim",
            )
        )
