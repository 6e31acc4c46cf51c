"""The answer schema of an extraction campaign, judged by the `jsonschema` library (H2).

Why the library and not a hand-written subset: a checker that ignores `minimum`, `pattern`,
`oneOf` or `$ref` reports "schema valid" for answers the user's own schema rejects, so the
schema-validity guard would be overstated exactly where the user was most precise.

The draft is the one the schema declares in `$schema`; a schema without `$schema` is read as
JSON Schema 2020-12 (`DEFAULT_DRAFT`). An unknown `$schema` is an error, never a silent guess.
`format` is asserted (a `"format": "date"` field must hold a date), references resolve inside
the schema only (`#/$defs/...`): nothing is fetched from the network. jsonschema is imported
inside the functions, so loading a campaign without a schema never pays for it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

DEFAULT_DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _drafts() -> dict[str, Any]:
    """Validator class per known `$schema` URI (with and without the trailing '#')."""
    from jsonschema import validators

    out: dict[str, Any] = {}
    for cls in (
        validators.Draft202012Validator,
        validators.Draft201909Validator,
        validators.Draft7Validator,
        validators.Draft6Validator,
        validators.Draft4Validator,
    ):
        uri = cls.META_SCHEMA.get("$id") or cls.META_SCHEMA.get("id")
        out[uri.rstrip("#")] = cls
    return out


def _validator_class(schema: dict[str, Any]) -> Any:
    declared = schema.get("$schema", DEFAULT_DRAFT)
    if not isinstance(declared, str):
        raise ValueError("`$schema` must be a string naming a JSON Schema draft")
    drafts = _drafts()
    cls = drafts.get(declared.rstrip("#"))
    if cls is None:
        known = ", ".join(sorted(drafts))
        raise ValueError(f"unknown `$schema` {declared!r}; use one of {known} (or leave it out "
                         "for 2020-12)")  # fmt: skip
    return cls


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a valid JSON Schema of its draft (with the path inside it), or None.

    Run when the campaign is loaded, so `tunepilot validate` names the broken key instead of
    an evaluation failing hours into a rental.
    """
    if not isinstance(schema, dict):
        return f"a JSON Schema is a mapping, not a {type(schema).__name__}"
    from jsonschema.exceptions import best_match

    try:
        cls = _validator_class(schema)
    except ValueError as exc:
        return str(exc)
    error = best_match(cls(cls.META_SCHEMA).iter_errors(schema))
    if error is None:
        return _unresolvable_ref(cls, schema)
    where = ".".join(str(p) for p in error.absolute_path)
    return f"at `{where or '(top level)'}`: {error.message}"


def _unresolvable_ref(cls: Any, schema: dict[str, Any]) -> str | None:
    """A `$ref` that points nowhere inside the schema: remote references are never fetched,
    so one that cannot be found here would fail every evaluation instead."""
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import specification_with

    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    if not refs:
        return None
    uri = cls.META_SCHEMA.get("$id") or cls.META_SCHEMA.get("id")
    resource = specification_with(uri).create_resource(schema)
    resolver = Registry().with_resource(uri="", resource=resource).resolver(base_uri="")
    for ref in refs:
        try:
            resolver.lookup(ref)
        except Unresolvable:
            return (f"`$ref` {ref!r} points to nothing inside the schema (references are "
                    "resolved inside the schema only; put the target under `$defs`)")  # fmt: skip
    return None


@lru_cache(maxsize=32)
def _cached_validator(text: str) -> Any:
    schema = json.loads(text)
    cls = _validator_class(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def answer_validator(schema: dict[str, Any]) -> Any:
    """A jsonschema validator for `schema` under its declared draft, with formats asserted;
    built once per schema (an evaluation checks every output against the same one)."""
    return _cached_validator(json.dumps(schema, sort_keys=True))


def schema_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Every way `value` breaks `schema`, as "$.amount: -1 is less than the minimum of 0"
    sentences, in a stable order (by path, then message)."""
    validator = answer_validator(schema)
    found = [(e.json_path, e.message) for e in validator.iter_errors(value)]
    return [f"{path}: {message}" for path, message in sorted(found)]
