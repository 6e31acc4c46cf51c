"""Reading a campaign file: YAML, dotted overrides, and errors that name the key, the line
and the fix. All problems are collected and raised together (STYLE: `tune validate`)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from tunepilot.campaign.schema import Campaign, Strict
from tunepilot.campaign.yaml_reader import UniqueKeyLoader, key_lines, read_yaml
from tunepilot.errors import InputError, Problem, input_error

# --------------------------------------------------------------------------------------------
# loading, overrides, errors that name the key and the fix
# --------------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """`training.lr=5e-5` -> (["training", "lr"], 5e-05). Values are parsed as YAML scalars."""
    if "=" not in text:
        raise InputError(
            [Problem(text, "an override without `=`", "write it as key.path=value")],
            title="invalid override",
        )
    key, raw = text.split("=", 1)
    if not key.strip():
        raise InputError(
            [Problem(text, "an empty key", "write it as key.path=value")], title="invalid override"
        )
    where = f"command-line override `{text}`"
    value = read_yaml(raw, where, "invalid override", text_if_invalid=True) if raw.strip() else ""
    return key.strip().split("."), value


def _section(path: tuple[str, ...]) -> type[BaseModel] | None:
    """The schema section (a pydantic model) at a key path, None for a setting or an unknown
    key. Free-form mappings such as `data.files` or `class_floors` are settings: set whole."""
    current: Any = Campaign
    for part in path:
        field = current.model_fields.get(part)
        model = _first_model(field.annotation) if field is not None else None
        if field is None or model is None or _is_free_mapping(field.annotation):
            return None
        current = model
    return current


def _is_free_mapping(annotation: Any) -> bool:
    """`dict[str, X]` (variants) holds names, not settings of one section."""
    return getattr(annotation, "__origin__", None) is dict or any(
        getattr(a, "__origin__", None) is dict for a in getattr(annotation, "__args__", ()) or ()
    )


def leaf_settings(
    pairs: list[tuple[list[str], Any]] | dict[str, Any],
) -> dict[tuple[str, ...], Any]:
    """Overrides as the leaf settings they change, however they are written.

    `training: {lr: 2e-4, microbatch: 4}`, `training.lr: 2e-4` and `training: {budget.updates:
    9}` all name leaf keys of the schema; a nested mapping is never a replacement of its whole
    section (that would silently reset every sibling setting to its default). Unknown keys stay
    as written, so validation reports them with a did-you-mean.
    """
    items = [(k.split("."), v) for k, v in pairs.items()] if isinstance(pairs, dict) else pairs
    out: dict[tuple[str, ...], Any] = {}

    def walk(path: tuple[str, ...], value: Any) -> None:
        if isinstance(value, dict) and _section(path) is not None:
            for key, child in value.items():
                walk((*path, *str(key).split(".")), child)
        else:
            out[path] = value

    for path, value in items:
        walk(tuple(p.strip() for p in path), value)
    return out


def apply_overrides(
    raw: Any, overrides: list[str] | dict[str, Any], source: str = "campaign"
) -> dict[str, Any]:
    """Set each overridden leaf setting in the raw mapping; schema validation comes after."""
    if not isinstance(raw, dict):
        raise InputError(
            [Problem(source, f"the top level is {type(raw).__name__}", "make it a YAML mapping")],
            title="invalid campaign",
        )
    pairs = [parse_override(o) for o in overrides] if isinstance(overrides, list) else overrides
    out = json.loads(json.dumps(raw, default=str))
    for path, value in leaf_settings(pairs).items():
        node = out
        for depth, part in enumerate(path[:-1], start=1):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                above = ".".join(path[:depth])
                raise input_error(
                    ".".join(path), f"`{above}` is a {type(child).__name__}, not a section",
                    f"set `{above}` as a whole instead", title="invalid override",
                )  # fmt: skip
            node = child
        node[path[-1]] = value
    return out


def _allowed_keys(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """The keys the schema accepts at `path` (the parent of an unknown key)."""
    current: Any = model
    for part in path:
        if isinstance(part, int) or not (
            isinstance(current, type) and issubclass(current, BaseModel)
        ):
            return []
        field = current.model_fields.get(part)
        if field is None:
            return []
        current = _first_model(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _first_model(annotation: Any) -> Any:
    """The pydantic model inside an annotation such as `X | None` or `dict[str, X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_type_tag(part: Any) -> bool:
    """pydantic puts union-branch names ("MaxChars", "literal[...]") in error locations."""
    if not isinstance(part, str):
        return False
    return (
        part in _TYPE_TAGS
        or part.startswith(("literal[", "function-", "union["))
        or part in {m.__name__ for m in Strict.__subclasses__()}
    )


def _where(
    loc: tuple[Any, ...], source: str, lines: dict[tuple[str, ...], int],
    overridden: dict[tuple[str, ...], str],
) -> str:  # fmt: skip
    """A command-line override names itself; a file key names its line (16b: never the line of
    the section a wrong override merely sits in)."""
    key = ".".join(str(p) for p in loc) or "(top level)"
    path = tuple(str(p) for p in loc)
    for over, text in overridden.items():
        if path[: len(over)] == over:
            return f"command-line override `{text}`"
    line = None
    for n in range(len(path), 0, -1):
        line = lines.get(path[:n])
        if line:
            break
    where = f"{source}:{line} {key}" if line else f"{source} {key}"
    involved = [text for over, text in overridden.items() if over[: len(path)] == path]
    if involved:
        where += f" (with the command-line override {', '.join(f'`{t}`' for t in involved)})"
    return where


def _problem_from_error(
    err: dict[str, Any], source: str, lines: dict[tuple[str, ...], int],
    overridden: dict[tuple[str, ...], str] | None = None,
) -> Problem:  # fmt: skip
    names_a_key = "[key]" in err["loc"]  # a mapping key (a variant name) is wrong, not a value
    loc = tuple(p for p in err["loc"] if not _is_type_tag(p) and p != "[key]")
    key = ".".join(str(p) for p in loc) or "(top level)"
    where = _where(loc, source, lines, overridden or {})
    kind = err["type"]
    found_value = err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(Campaign, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`?" if close else ""
        fix = f"{hint} allowed keys here: {', '.join(allowed)}" if allowed else "remove it"
        return Problem(where, f"unknown key `{loc[-1]}`", fix.strip())
    if kind == "missing":
        return Problem(where, "a required key is missing", f"add `{key}` (see `tunepilot schema`)")
    msg = err["msg"]
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        return Problem(where, msg, "change the value as the message says")
    shown = json.dumps(found_value, default=str)[:80] if found_value is not None else "nothing"
    if names_a_key:
        msg = f"the name {shown} is refused: {msg[:1].lower()}{msg[1:]}"
    return Problem(where, f"{msg} (found {shown})" if not names_a_key else msg,
                   _FIXES.get(kind, "see the allowed values in `tunepilot schema`"))


_FIXES = {
    "string_pattern_mismatch": "use letters, digits, `.`, `_` and `-`, starting with a letter "
    "or digit: the name becomes a folder name",
    "too_short": "give at least one value",
    "finite_number": "write a finite number (.inf and .nan are not settings)",
    "less_than_equal": "use a value within the bound the message gives",
    "less_than": "use a value within the bound the message gives",
    "greater_than_equal": "use a value within the bound the message gives",
    "greater_than": "use a value within the bound the message gives",
}


def validate_mapping(
    raw: Any, source: str = "campaign", text: str | None = None,
    overridden: dict[tuple[str, ...], str] | None = None,
) -> Campaign:  # fmt: skip
    """Validate an already-parsed mapping; all problems are raised together. `overridden` maps
    the leaf keys set on the command line to the argument that set them."""
    if not isinstance(raw, dict):
        raise InputError(
            [Problem(source, f"the top level is {type(raw).__name__}", "make it a YAML mapping")],
            title="invalid campaign",
        )
    try:
        return Campaign.model_validate(raw)
    except ValidationError as exc:
        lines = key_lines(text) if text else {}
        problems = list(dict.fromkeys(
            _problem_from_error(e, source, lines, overridden) for e in exc.errors()))
        raise InputError(problems, title=f"invalid campaign {source}") from None


def load_campaign(path: str | Path, overrides: list[str] | None = None) -> Campaign:
    """Read, override and validate a campaign file. Relative data paths resolve next to it."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            [
                Problem(
                    str(path),
                    "no such campaign file",
                    "give the path to campaign.yaml, "
                    "or create one with `tunepilot init DIR --task classification`",
                )
            ],
            title="invalid campaign",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            [Problem(str(path), f"not UTF-8 (byte {exc.start})", "save the file as UTF-8")],
            title="invalid campaign",
        ) from None
    raw = read_yaml(text, str(path), "invalid campaign", loader=UniqueKeyLoader)
    overridden: dict[tuple[str, ...], str] = {}
    if overrides:
        raw = apply_overrides({} if raw is None else raw, overrides, source=str(path))
        for arg in overrides:
            overridden.update(dict.fromkeys(leaf_settings([parse_override(arg)]), arg))
    return validate_mapping(raw, source=str(path), text=text, overridden=overridden)


def campaign_root(campaign_path: str | Path) -> Path:
    """The campaign folder: where the ledger, data versions, runs and pilots live."""
    return Path(campaign_path).resolve().parent


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the campaign file, for editors' completion."""
    return Campaign.model_json_schema()
