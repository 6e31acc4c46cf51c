"""`data.chat`: conversation rows and how to read them (H1 "a response format", D5).

Its own module because the campaign schema is long already; it is a section like the others
(unknown keys are errors) and `schema.DataSettings.chat` holds it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tunepilot.campaign.bounds import Strict

ChatRole = Literal["system", "user", "assistant"]


class ChatSettings(Strict):
    """Conversations instead of text + target columns (H1 "a response format"): one row is one
    conversation, `messages: [{role, content}, ...]` as TRL, Axolotl and LLaMA-Factory take it,
    or ShareGPT's `conversations: [{from, value}, ...]` mapped by the keys below (the names are
    Axolotl's `chat_template` dataset keys). It is rendered with the tokenizer's own chat
    template and the loss falls on assistant turns only (D5)."""

    field_messages: str = Field(
        default="messages", description="Column holding the list of turns (`conversations`)."
    )
    message_property_mappings: dict[Literal["role", "content"], str] = Field(
        default_factory=lambda: {"role": "role", "content": "content"},
        description="Keys of a turn holding its role and text; ShareGPT: {role: from, "
        "content: value}.",
    )
    roles: dict[ChatRole, list[str]] = Field(
        default_factory=lambda: {
            "system": ["system"],
            "user": ["user", "human"],
            "assistant": ["assistant", "gpt"],
        },
        description="Role names in your data for each chat-template role.",
    )
    assistant_turns: Literal["all", "last"] = Field(
        default="all",
        description="Loss on every assistant turn, or on the last one only (LLaMA-Factory "
        "mask_history); the last one is the answer evaluation scores.",
    )
    chat_template_jinja: str | None = Field(
        default=None,
        description="A Jinja chat template; null uses the tokenizer's own `chat_template`.",
    )

    @model_validator(mode="after")
    def _roles_are_distinct(self) -> ChatSettings:
        names = [n for values in self.roles.values() for n in values]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"role names {repeated} are listed under two roles; keep one")
        if "user" not in self.roles or "assistant" not in self.roles:
            raise ValueError("`roles` needs `user` and `assistant` entries")
        return self
