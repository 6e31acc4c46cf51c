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
from typing import Any, Literal, TypedDict, Unpack

from tunepilot.campaign import stable_hash
from tunepilot.errors import InputError, Problem, input_error
from tunepilot.tasks.base import IGNORE_INDEX, Encoded
from tunepilot.tasks.classification import _value_text, tokenizer_identity
from tunepilot.tasks.example import Example


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


class AnswerRules(TypedDict, total=False):
    """How a causal-LM answer is trained and judged, the same for a template and a chat."""

    mask_prompt: bool
    task: Literal["extraction", "format"]
    required_fields: list[str] | None
    schema: dict[str, Any] | None


class CausalLMEncoder:
    """What every causal-LM encoder shares: the answer the model must write (EOS-terminated,
    judged by the task's required fields and schema), the cut at max_length, the loss mask."""

    kind = "causal_lm"

    def __init__(
        self,
        tokenizer: Any,
        max_length: int,
        mask_prompt: bool = True,
        task: Literal["extraction", "format"] = "extraction",
        required_fields: list[str] | None = None,
        schema: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.mask_prompt = mask_prompt
        self.task = task
        self.required_fields = list(required_fields or [])
        self.schema = schema
        self._identity = tokenizer_identity(tokenizer)

    def answer_text(self, example: Example) -> str:
        """The answer the model must write, without EOS."""
        return answer_text(example, self.task)

    def gold_object(self, example: Example) -> dict[str, Any]:
        """The extraction target as a JSON object."""
        return gold_object(example)

    def expected_target(self, example: Example) -> str:
        return self.answer_text(example)

    @property
    def answers_are_json(self) -> bool:
        """Whether an answer is a JSON object the format guards judge (H2): always for
        prompt/answer rows (the loader holds format and extraction targets to JSON); for a
        conversation, when its task is extraction or its hypothesis names fields or a schema."""
        return True

    def training_view(self) -> CausalLMEncoder:
        return self

    def _loss_on(
        self,
        example: Example,
        full: list[int],
        spans: list[tuple[int, int]],
        *,
        prompt_length: int | None = None,
        turns: list[int] | None = None,
    ) -> Encoded:
        """`full` cut to max_length (truncation keeps the start), loss on the token `spans`
        (every token when data.mask_prompt is false). A span the cut reaches into is a
        truncated target (S6), named by its number in `turns` when the spans are turns.
        `prompt_length` defaults to the first position carrying loss."""
        ids = full[: self.max_length]
        labels = [IGNORE_INDEX] * len(ids) if self.mask_prompt else list(ids)
        for start, end in spans:
            for k in range(start, min(end, len(ids))):
                labels[k] = ids[k]
        cut = [i for i, (_, end) in enumerate(spans) if end > len(ids)]
        first_loss = next((k for k, t in enumerate(labels) if t != IGNORE_INDEX), len(ids))
        return Encoded(
            example_id=example.id,
            input_ids=ids,
            labels=labels,
            prompt_length=first_loss if prompt_length is None else prompt_length,
            truncated=len(full) > len(ids),
            target_truncated=bool(cut),
            full_length=len(full),
            cut_turns=[turns[i] for i in cut] if turns else [],
        )

    def apply_chat_template(
        self, where: str, turns: list[dict[str, str]], template: str | None, origin: str,
        **options: Any,
    ) -> Any:
        """The tokenizer's `apply_chat_template` (with `template`, else its own), within a
        time and an output bound (`render_bound`); what the template refuses, and a rendering
        past either bound, is an input error naming the row `where` and the template `origin`
        (the template alone, for a syntax error), never a traceback or a hang."""
        from jinja2 import TemplateError, TemplateSyntaxError

        from tunepilot.tasks import render_bound as bound

        try:
            with bound.time_bound():
                rendered = self.tokenizer.apply_chat_template(
                    turns, chat_template=template, **options)  # fmt: skip
        except bound.RenderTimeout:
            raise input_error(
                f"{origin} (rendering {where or 'a conversation'})",
                f"the chat template took over {bound.RENDER_SECONDS:g} s to render one "
                "conversation (a loop over a large range, or loops nested)",
                "fix the template: a chat template renders a conversation in milliseconds",
                title="chat template refused",
            ) from None
        except TemplateSyntaxError as exc:
            raise input_error(
                origin,
                f"the chat template is not valid Jinja (line {exc.lineno}: {exc.message})",
                "fix the template, or set data.chat.chat_template_jinja to one that renders",
                title="invalid chat template",
            ) from None
        except TemplateError as exc:
            roles = ", ".join(t["role"] for t in turns)
            raise input_error(
                where or "data.chat",
                f"the chat template refuses this conversation ({exc}); its roles are {roles}",
                "make the row follow the template's rule (e.g. fold a system turn into the "
                "first user turn, alternate user and assistant), or set "
                "data.chat.chat_template_jinja to a template that accepts it",
                title="conversation refused by the chat template",
            ) from None
        if bound.rendered_size(rendered) > (limit := bound.max_chars(turns)):
            raise input_error(
                f"{origin} (rendering {where or 'a conversation'})",
                f"the chat template wrote {bound.rendered_size(rendered):,} characters (or "
                f"tokens) for one conversation, over the bound of {limit:,}",
                "fix the template: it repeats far more text than the conversation holds",
                title="chat template refused",
            )
        return rendered

    def _described(self, **own: Any) -> dict[str, Any]:
        """describe(): the shared settings around what the subclass adds (it is hashed into the
        data version's encoding, so every setting that changes the tokens is in it)."""
        return {
            "kind": self.kind,
            "task": self.task,
            "tokenizer": self._identity,
            "max_length": self.max_length,
            **own,
            "mask_prompt": self.mask_prompt,
            "required_fields": self.required_fields,
            "schema": self.schema,
        }


class GenerationEncoder(CausalLMEncoder):
    """Encode prompt + answer + EOS for a causal LM, with the prompt masked from the loss (D5)."""

    def __init__(
        self, tokenizer: Any, template: str, max_length: int, **answers: Unpack[AnswerRules]
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
        super().__init__(tokenizer, max_length, **answers)
        self.template = template
        self.template_fields = [f for f in dict.fromkeys(fields) if f != "text"]
        self.uses_chat_template = bool(getattr(tokenizer, "chat_template", None))

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
        return self.apply_chat_template(
            example.source, [{"role": "user", "content": body}], None,
            "the tokenizer's chat_template", add_generation_prompt=True, tokenize=False,
        )  # fmt: skip

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
        full = prompt + self._answer_ids(example)
        n_prompt = min(len(prompt), self.max_length)
        return self._loss_on(example, full, [(len(prompt), len(full))], prompt_length=n_prompt)

    def describe(self) -> dict[str, Any]:
        chat = getattr(self.tokenizer, "chat_template", None)
        return self._described(
            template=self.template, chat_template_hash=stable_hash(chat) if chat else None
        )
