"""One conversation row -> its turns in chat-template form, every bad turn named (D5).

Rows come as TRL / Axolotl / LLaMA-Factory write them (`messages: [{role, content}, ...]`) or
as ShareGPT does (`conversations: [{from, value}, ...]`); `data.chat` says which keys and role
names to read. The result always uses the chat-template roles `system`, `user`, `assistant`
and the key names `role` / `content`, so the encoder and the audit never see the source shape.

Why refuse rather than repair: a turn without a role or an assistant turn without text renders
into a template as something the user did not write, and trains on it silently.
"""

from __future__ import annotations

from typing import Any

from tunepilot.campaign import ChatSettings
from tunepilot.errors import ProblemList

INPUT_ROLES = ("system", "user")


def read_conversation(
    value: Any, where: str, chat: ChatSettings, problems: ProblemList
) -> list[dict[str, str]] | None:
    """The turns of one row, or None after adding a problem for each thing wrong with them."""
    field = chat.field_messages
    role_key = chat.message_property_mappings.get("role", "role")
    content_key = chat.message_property_mappings.get("content", "content")
    if not isinstance(value, list) or not value:
        found = "empty" if value in (None, "", []) else f"a {type(value).__name__}"
        problems.add(
            where,
            f"`{field}` is {found}, not a list of turns",
            f'write it as [{{"{role_key}": "user", "{content_key}": ...}}, ...]',
        )
        return None
    role_of = {name: role for role, names in chat.roles.items() for name in names}
    before = problems.count
    turns: list[dict[str, str]] = []
    for number, turn in enumerate(value, start=1):
        at = f"{where} {field}[{number - 1}]"
        if not isinstance(turn, dict):
            problems.add(at, f"turn {number} is a {type(turn).__name__}", "make it an object")
            continue
        raw_role = turn.get(role_key)
        if raw_role is None or raw_role == "":
            problems.add(
                at,
                f"turn {number} has no `{role_key}`",
                f"give every turn a `{role_key}` (or map the key in "
                "data.chat.message_property_mappings.role)",
            )
            continue
        role = role_of.get(str(raw_role))
        if role is None:
            problems.add(
                at,
                f"turn {number} has role `{raw_role}`, which data.chat.roles does not name",
                f"add `{raw_role}` to one of data.chat.roles (system, user, assistant)",
            )
            continue
        content = turn.get(content_key)
        if not isinstance(content, str):
            kind = type(content).__name__
            shown = "no" if content is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} as"
            fix = (f"give it text in `{content_key}` (or map the key in "
                   "data.chat.message_property_mappings.content)")  # fmt: skip
            if isinstance(content, list):  # OpenAI-style parts: [{"type": "text", "text": ...}]
                fix = (f"content parts are not read: join the text parts into one string in "
                       f"`{content_key}` (images and other parts have no place in a text "
                       "campaign)")  # fmt: skip
            problems.add(at, f"turn {number} ({role}) has {shown} `{content_key}`", fix)
            continue
        if role == "assistant" and not content.strip():
            problems.add(
                at,
                f"turn {number} is an assistant turn with empty `{content_key}`",
                "write the answer or remove the turn: an empty answer teaches the model to "
                "say nothing",
            )
            continue
        turns.append({"role": role, "content": content})
    if problems.count > before:
        return None
    return _whole(turns, where, field, chat, problems)


def _whole(
    turns: list[dict[str, str]], where: str, field: str, chat: ChatSettings, problems: ProblemList
) -> list[dict[str, str]] | None:
    """Checks on the conversation as a whole: an answer to learn, and where it stands."""
    roles = [t["role"] for t in turns]
    if "assistant" not in roles:
        problems.add(where, f"`{field}` has no assistant turn", "add the answer to learn")
        return None
    if "user" not in roles[: roles.index("assistant")]:
        problems.add(
            where,
            "the first assistant turn answers no user turn",
            "start the conversation with a user turn (after an optional system turn)",
        )
        return None
    if chat.assistant_turns == "last" and roles[-1] != "assistant":
        problems.add(
            where,
            f"the conversation ends on a {roles[-1]} turn, but data.chat.assistant_turns: last "
            "trains on the last turn as the answer",
            "end the row with the assistant's answer, or drop the trailing turn(s)",
        )
        return None
    return turns


def input_text(turns: list[dict[str, str]]) -> str:
    """The system and user turns, one per paragraph: the input side of a conversation, which
    duplicate searches compare and cleaning rules touch (answers are never cleaned)."""
    return "\n\n".join(t["content"] for t in turns if t["role"] in INPUT_ROLES)


def last_answer(turns: list[dict[str, str]]) -> str:
    """The last assistant turn: the answer evaluation scores."""
    return next(t["content"] for t in reversed(turns) if t["role"] == "assistant")
