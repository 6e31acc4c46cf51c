"""Causal-LM tasks: a prompt, then the answer the model must write (D3, D5).

Extraction answers are the canonical JSON of the target; format answers are the target text.
The prompt and the answer are tokenized separately and concatenated, so the boundary between
"instruction" and "answer" is exact in token ids, and the loss mask (D5) can never straddle a
merged BPE token. The answer always ends with EOS: a model never shown EOS never learns to stop,
and the evaluation stops at EOS.
"""

from __future__ import annotations

import json
import string
from typing import Any, Literal

from tunepilot.campaign import stable_hash
from tunepilot.errors import InputError, Problem
from tunepilot.tasks.base import IGNORE_INDEX, Encoded
from tunepilot.tasks.classification import _value_text, tokenizer_identity
from tunepilot.tasks.example import Example
from tunepilot.verdict import Finding, Verdict


def canonical_answer(target: Any) -> str:
    """The one JSON spelling of an answer: key order as given, UTF-8, no spaces."""
    return json.dumps(target, sort_keys=False, ensure_ascii=False, separators=(",", ":"))


def answer_text(example: Example, task: str) -> str:
    """The answer the model must write, without EOS: the target text (format) or the canonical
    JSON of the extraction target. Shared by every causal-LM encoder."""
    target = example.target
    if target is None:
        raise InputError(
            [
                Problem(
                    example.source,
                    f"example {example.id} has no target",
                    "fill the target column for every row (data.fields.target)",
                )
            ],
            title="missing target",
        )
    if task == "format":
        return target if isinstance(target, str) else canonical_answer(target)
    return canonical_answer(gold_object(example))


def gold_object(example: Example) -> dict[str, Any]:
    """The extraction target as a JSON object (a JSON string is parsed once, here)."""
    target = example.target
    if isinstance(target, str):
        try:
            target = json.loads(target)
        except json.JSONDecodeError as exc:
            raise InputError(
                [
                    Problem(
                        example.source,
                        f"example {example.id}: target is not JSON ({exc.msg})",
                        "write the target as a JSON object",
                    )
                ],
                title="invalid target",
            ) from None
    if not isinstance(target, dict):
        raise InputError(
            [
                Problem(
                    example.source,
                    f"example {example.id}: target is {type(target).__name__}, not an object",
                    "extraction targets are JSON objects with fields",
                )
            ],
            title="invalid target",
        )
    return target


class GenerationEncoder:
    """Encode prompt + answer + EOS for a causal LM, with the prompt masked from the loss (D5)."""

    kind = "causal_lm"

    def __init__(
        self,
        tokenizer: Any,
        template: str,
        max_length: int,
        mask_prompt: bool = True,
        task: Literal["extraction", "format"] = "extraction",
        required_fields: list[str] | None = None,
        schema: dict[str, Any] | None = None,
    ) -> None:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise InputError(
                [
                    Problem(
                        "data.template",
                        f"not a valid template ({exc})",
                        "write fields as {text}; double literal braces as {{ and }}",
                    )
                ],
                title="invalid template",
            ) from None
        if "text" not in fields:
            raise InputError(
                [
                    Problem(
                        "data.template",
                        f"{template!r} has no {{text}} field",
                        "put {text} where the example text goes",
                    )
                ],
                title="invalid template",
            )
        if tokenizer.eos_token_id is None:
            raise InputError(
                [
                    Problem(
                        "model.name_or_path",
                        "the tokenizer has no EOS token",
                        "use a tokenizer with an eos_token (the answer must end with it)",
                    )
                ],
                title="invalid tokenizer",
            )
        self.tokenizer = tokenizer
        self.template = template
        self.max_length = max_length
        self.mask_prompt = mask_prompt
        self.task = task
        self.required_fields = list(required_fields or [])
        self.schema = schema
        self.template_fields = [f for f in dict.fromkeys(fields) if f != "text"]
        self.uses_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self._identity = tokenizer_identity(tokenizer)

    # -- the two halves ------------------------------------------------------------------------

    def render_prompt(self, example: Example) -> str:
        """The prompt text exactly as tokenized (chat template applied when the model has one)."""
        values = {k: _value_text(v) for k, v in example.context.items()}
        missing = [f for f in self.template_fields if f not in values]
        if missing:
            raise InputError(
                [
                    Problem(
                        example.source,
                        f"example {example.id} has no field(s) {missing} used by data.template",
                        "add the column(s) to data.fields.context or remove them from the template",
                    )
                ],
                title="template field missing",
            )
        body = self.template.format(**{**values, "text": example.text})
        if not self.uses_chat_template:
            return body
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": body}], add_generation_prompt=True, tokenize=False
        )

    def answer_text(self, example: Example) -> str:
        """The answer the model must write, without EOS."""
        return answer_text(example, self.task)

    def gold_object(self, example: Example) -> dict[str, Any]:
        """The extraction target as a JSON object."""
        return gold_object(example)

    def prompt_ids(self, example: Example) -> list[int]:
        """Prompt token ids, cut to max_length as in training: what generation starts from.

        A chat template writes its own special tokens into the text, so the tokenizer adds
        none; a plain template gets the tokenizer's usual ones (e.g. BOS).
        """
        text = self.render_prompt(example)
        ids = self.tokenizer(text, add_special_tokens=not self.uses_chat_template, verbose=False)[
            "input_ids"
        ]
        return list(ids)[: self.max_length]

    def _answer_ids(self, example: Example) -> list[int]:
        ids = self.tokenizer(self.answer_text(example), add_special_tokens=False, verbose=False)
        return [*ids["input_ids"], self.tokenizer.eos_token_id]

    # -- the protocol ----------------------------------------------------------------------------

    def encode(self, example: Example) -> Encoded:
        """prompt ids + answer ids + EOS; labels are IGNORE_INDEX on the prompt when masked.

        Truncation keeps the start (the instruction); when it cuts answer tokens the example
        is flagged `target_truncated` (S6: a fit bought by cutting the answer is another task).
        """
        text = self.render_prompt(example)
        prompt = list(
            self.tokenizer(text, add_special_tokens=not self.uses_chat_template, verbose=False)[
                "input_ids"
            ]
        )
        answer = self._answer_ids(example)
        full = prompt + answer
        ids = full[: self.max_length]
        n_prompt = min(len(prompt), len(ids))
        prompt_labels = [IGNORE_INDEX] * n_prompt if self.mask_prompt else ids[:n_prompt]
        labels = prompt_labels + ids[n_prompt:]
        return Encoded(
            example_id=example.id,
            input_ids=ids,
            labels=labels,
            prompt_length=n_prompt,
            truncated=len(full) > len(ids),
            target_truncated=len(full) > len(ids),
            full_length=len(full),
        )

    def expected_target(self, example: Example) -> str:
        return self.answer_text(example)

    def training_view(self) -> GenerationEncoder:
        return self

    def describe(self) -> dict[str, Any]:
        chat = getattr(self.tokenizer, "chat_template", None)
        return {
            "kind": self.kind,
            "task": self.task,
            "tokenizer": self._identity,
            "max_length": self.max_length,
            "template": self.template,
            "chat_template_hash": stable_hash(chat) if chat else None,
            "mask_prompt": self.mask_prompt,
            "required_fields": self.required_fields,
            "schema": self.schema,
        }


def check_loss_tokens(encoded: list[Encoded]) -> list[Finding]:
    """D5/S6: an example whose labels are all IGNORE_INDEX teaches nothing and, averaged per
    token, can divide by zero. FAIL naming them; WARN for answers that lost some tokens."""
    empty = [e.example_id for e in encoded if e.loss_tokens == 0]
    cut = [e.example_id for e in encoded if e.target_truncated and e.loss_tokens > 0]
    findings: list[Finding] = []
    if empty:
        findings.append(
            Finding(
                "loss tokens",
                Verdict.FAIL,
                f"{len(empty)} of {len(encoded)} examples have no position carrying loss "
                f"(e.g. {', '.join(empty[:3])}): the prompt fills max_length; raise "
                "data.max_length or shorten the template",
                requirement="D5, S6",
                examples=empty[:20],
                details={"count": len(empty)},
            )
        )
    if cut:
        findings.append(
            Finding(
                "answer truncated",
                Verdict.WARN,
                f"{len(cut)} of {len(encoded)} examples lose answer tokens to max_length "
                f"(e.g. {', '.join(cut[:3])}); the model is trained on answers without their "
                "end; raise data.max_length",
                requirement="S6",
                examples=cut[:20],
                details={"count": len(cut)},
            )
        )
    if not findings:
        findings.append(
            Finding(
                "loss tokens",
                Verdict.PASS,
                f"all {len(encoded)} examples carry loss on their full answer",
                requirement="D5",
            )
        )
    return findings
