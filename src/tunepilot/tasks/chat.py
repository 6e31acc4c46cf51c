"""Conversations rendered with the model's own chat template, loss on assistant turns (D3, D5).

The template decides every token the model sees: role headers, separators, BOS, the
end-of-turn marker. So the loss positions are taken from the template's own rendering, never
from a re-implementation of it, in one of two ways (the encoding records which):

- `generation tags`: a template that wraps assistant text in `{% generation %}` (as TRL's
  assistant-only-loss templates do) lets transformers return the assistant tokens itself
  (`apply_chat_template(..., return_assistant_tokens_mask=True)`).
- `prefix diff`: otherwise each assistant turn is located by rendering the conversation up to
  the turn with the generation prompt, and up to the end of the turn; where each of the two
  renderings stops agreeing with the whole conversation's are the turn's ends (its
  end-of-turn marker included, so the model learns to stop), and the tokens whose offsets fall
  there carry its loss. A rendering may differ from the whole one only by special tokens or
  whitespace in its tail (Phi-3 closes a conversation with EOS, not each turn); a template
  that renders an earlier turn otherwise once more turns follow (one that drops the reasoning
  of earlier answers) is refused, as is one whose located span does not hold the turn's text:
  there is no honest mask.

A template that refuses a conversation (`raise_exception`: roles must alternate, no system
role) is the row's input error, named by file:line with the template's own message.

Evaluation prompts the model with every turn before the last assistant turn and scores what it
writes against that turn.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Unpack

from tunepilot.campaign import ChatSettings, stable_hash
from tunepilot.errors import InputError, Problem
from tunepilot.tasks.base import Encoded
from tunepilot.tasks.example import Example
from tunepilot.tasks.generation import AnswerRules, CausalLMEncoder

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
MaskMethod = Literal["generation tags", "prefix diff"]


def _refuse(where: str, found: str, fix: str, title: str = "invalid chat template") -> InputError:
    return InputError([Problem(where, found, fix)], title=title)


class ChatEncoder(CausalLMEncoder):
    """Encode a conversation with the chat template; loss on assistant turns only (D5)."""

    uses_chat_template = True  # the rendered text holds its special tokens (BOS included)

    def __init__(
        self, tokenizer: Any, chat: ChatSettings, max_length: int, **answers: Unpack[AnswerRules]
    ) -> None:
        template = chat.chat_template_jinja or getattr(tokenizer, "chat_template", None)
        if not template:
            raise _refuse(
                "data.chat.chat_template_jinja",
                "the tokenizer has no chat template and data.chat.chat_template_jinja is not set",
                "set data.chat.chat_template_jinja to the Jinja template the model was trained "
                "with (the `chat_template` of its instruct sibling's tokenizer_config.json), "
                "or use a base whose tokenizer ships one",
                title="no chat template",
            )
        if not getattr(tokenizer, "is_fast", False):
            raise _refuse(
                "model.name_or_path",
                "the tokenizer is a slow (Python) tokenizer without token offsets",
                "save the model with its fast tokenizer (tokenizer.json)",
                title="tokenizer cannot locate turns",
            )
        super().__init__(tokenizer, max_length, **{"task": "format", **answers})
        self.chat = chat
        self.template: str = template
        self._special_tokens = sorted(tokenizer.all_special_tokens, key=len, reverse=True)
        self.mask_method: MaskMethod = (
            "generation tags" if _GENERATION_TAG.search(template) else "prefix diff"
        )

    @property
    def answers_are_json(self) -> bool:
        """Assistant turns are free text unless the hypothesis says they are JSON (fields or a
        schema), or the task is extraction."""
        return self.task == "extraction" or bool(self.required_fields or self.schema)

    # -- rendering -----------------------------------------------------------------------------

    def render(
        self, turns: list[dict[str, str]], generation_prompt: bool = False, where: str = ""
    ) -> str:
        return self._apply(where, turns, tokenize=False, add_generation_prompt=generation_prompt)

    def _apply(self, where: str, turns: list[dict[str, str]], **options: Any) -> Any:
        origin = ("data.chat.chat_template_jinja" if self.chat.chat_template_jinja
                  else "the tokenizer's chat_template")  # fmt: skip
        return self.apply_chat_template(where, turns, self.template, origin, **options)

    def _turns(self, example: Example) -> list[dict[str, str]]:
        if not example.messages:
            raise _refuse(
                example.source,
                f"example {example.id} holds no conversation",
                "set data.chat only for files whose rows hold a list of turns",
                title="not a conversation",
            )
        return example.messages

    def _last_answer_index(self, turns: list[dict[str, str]]) -> int:
        return max(i for i, t in enumerate(turns) if t["role"] == "assistant")

    def render_prompt(self, example: Example) -> str:
        """Every turn before the last assistant turn, then the template's generation prompt."""
        turns = self._turns(example)
        prompt = turns[: self._last_answer_index(turns)]
        return self.render(prompt, generation_prompt=True, where=example.source)

    def prompt_ids(self, example: Example) -> list[int]:
        """The evaluation prompt's ids, cut to max_length as in training."""
        ids = self.tokenizer(self.render_prompt(example), add_special_tokens=False)["input_ids"]
        return list(ids)[: self.max_length]

    # -- where the assistant turns are ------------------------------------------------------------

    def _spans_by_generation_tags(
        self, example: Example, turns: list[dict[str, str]]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        out = self._apply(example.source, turns, tokenize=True, return_dict=True,
                          return_assistant_tokens_mask=True)  # fmt: skip
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        spans: list[tuple[int, int]] = []
        for i, flag in enumerate(mask):
            if flag and (i == 0 or not mask[i - 1]):
                spans.append((i, i + 1))
            elif flag:
                spans[-1] = (spans[-1][0], i + 1)
        return ids, spans

    def _spans_by_prefix_diff(
        self, example: Example, turns: list[dict[str, str]]
    ) -> tuple[list[int], list[tuple[int, int]]]:
        where = example.source
        full = self.render(turns, where=where)
        char_spans = []
        for i, turn in enumerate(turns):
            if turn["role"] != "assistant":
                continue
            before = self.render(turns[:i], generation_prompt=True, where=where)
            through = self.render(turns[: i + 1], where=where)
            start, end = self._prefix_end(before, full), self._prefix_end(through, full)
            if start is None or end is None or turn["content"].strip() not in full[start:end]:
                raise _refuse(
                    f"{where} (turn {i + 1})",
                    "the chat template renders the conversation up to this turn differently "
                    "once later turns follow, so the turn's tokens cannot be located",
                    "use a template that marks assistant text with {% generation %} ... "
                    "{% endgeneration %} in data.chat.chat_template_jinja",
                )
            char_spans.append((start, end))
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        spans = []
        for start, end in char_spans:
            inside = [k for k, (a, b) in enumerate(offsets) if b > start and a < end]
            spans.append((inside[0], inside[-1] + 1))  # never empty: it holds the turn's text
        return ids, spans

    def _prefix_end(self, part: str, whole: str) -> int | None:
        """Where `part` ends inside `whole`: its length if it is a prefix, else the length
        left once special tokens and whitespace are peeled off its end (a tail such as the EOS
        Phi-3 writes only after the last turn); None when no such prefix is found."""
        markers = self._special_tokens
        while not whole.startswith(part):
            peeled = part.rstrip() if part != part.rstrip() else next(
                (part[: -len(m)] for m in markers if m and part.endswith(m)), part)  # fmt: skip
            if peeled == part:
                return None
            part = peeled
        return len(part)

    # -- the protocol --------------------------------------------------------------------------

    def encode(self, example: Example) -> Encoded:
        """The whole conversation's ids; labels on the assistant turns declared by
        data.chat.assistant_turns (every token when data.mask_prompt is false). Truncation keeps
        the start; an assistant turn carrying loss that loses tokens is named in `cut_turns`."""
        turns = self._turns(example)
        if self.mask_method == "generation tags":
            full, spans = self._spans_by_generation_tags(example, turns)
        else:
            full, spans = self._spans_by_prefix_diff(example, turns)
        n_answers = sum(1 for t in turns if t["role"] == "assistant")
        if len(spans) != n_answers:
            raise _refuse(
                example.source,
                f"the template's generation tags mark {len(spans)} span(s) for {n_answers} "
                "assistant turn(s)",
                "wrap each assistant message, and only those, in {% generation %}",
            )
        numbers = list(range(1, len(spans) + 1))
        if self.chat.assistant_turns == "last":
            numbers, spans = numbers[-1:], spans[-1:]
        return self._loss_on(example, full, spans, turns=numbers)

    def describe(self) -> dict[str, Any]:
        return self._described(
            chat=self.chat.model_dump(mode="json"),
            chat_template_hash=stable_hash(self.template),
            loss_mask_method=self.mask_method,
        )
