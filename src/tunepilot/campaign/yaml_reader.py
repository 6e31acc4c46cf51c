"""The one reader of every YAML text a user hands over: the campaign file, a command-line
override's value, the GPU catalog (`--catalog`) and an Axolotl config (`--from-axolotl`).

YAML lets a short file stand for an enormous value: an anchor referenced nine times per level,
eight levels deep, is a 1.8 KB file that expands to 43 million values once anything walks it
(validation, a deep copy, JSON). PyYAML builds the shared value without complaint; every reader
after it pays for the expansion. So the text is composed into its node graph first (linear in
the text: an alias is a second edge to the same node), the graph is measured without
expanding it, and a file whose aliases add more than `MAX_ALIAS_VALUES` values, or that uses
more than `MAX_ALIASES` aliases, is refused naming the file and the anchor's line, before any
Python value is built. An anchor used inside itself is refused the same way.

libyaml (`yaml.CSafeLoader`, in PyYAML's wheels) parses when present: a 50 MB Axolotl file
composes in seconds rather than minutes; the pure-Python `SafeLoader` reads the same YAML.
"""

from __future__ import annotations

from typing import Any

import yaml

from tunepilot.errors import input_error

# The parser: libyaml when PyYAML was built with it, the same safe YAML either way.
SAFE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A campaign or an Axolotl config uses a few aliases; these bounds sit far above any config a
# person writes and far below what costs a reader noticeable time or memory.
MAX_ALIASES = 10_000
MAX_ALIAS_VALUES = 100_000
SELF_REFERENCE = ("a YAML anchor is used inside itself (e.g. `a: &x [*x]`), so the value would "
                  "contain itself")  # fmt: skip
SELF_REFERENCE_FIX = "write the value out, or point the alias at another anchor"


class UniqueKeyLoader(SAFE_LOADER):  # type: ignore[misc, valid-type]
    """A safe loader that refuses a key written twice: YAML would keep the last one silently,
    and the user would train a setting they did not see."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"key `{key}` appears twice (first on line {seen[key]}); keep one",
                    key_node.start_mark,
                )  # fmt: skip
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def alias_problem(root: yaml.Node) -> tuple[str, int | None] | None:
    """(what was found, 1-based line) when the node graph's aliases are too many, expand too
    far, or point into their own anchor; None for an ordinary document.

    One iterative walk (no recursion: a deep document must not exhaust the stack), each node
    sized once: the expanded size of a node is 1 + the sizes of its children, whether a child
    is written there or reached through an alias."""
    size: dict[int, int] = {}  # expanded size, once a node is left
    refs: dict[int, int] = {}  # how often a node is reached: written once, the rest aliases
    entered: set[int] = set()  # entered and not yet left: exactly the current path
    nodes: dict[int, yaml.Node] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if leaving:
            entered.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            continue
        refs[key] = refs.get(key, 0) + 1
        if key in entered:
            return SELF_REFERENCE, node.start_mark.line + 1
        if key in size:
            continue
        nodes[key] = node
        entered.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node))
    aliases = sum(n - 1 for n in refs.values())
    written = len(nodes)
    expanded = size[id(root)]
    if aliases > MAX_ALIASES or expanded - written > MAX_ALIAS_VALUES:
        shared = [k for k, n in refs.items() if n > 1]
        worst = max(shared, key=lambda k: size[k] * (refs[k] - 1)) if shared else id(root)
        line = nodes[worst].start_mark.line + 1
        return (f"YAML aliases expand {written:,} written values to {expanded:,} ({aliases:,} "
                f"alias uses; the value anchored on line {line} alone is repeated "
                f"{refs[worst] - 1:,} times): an alias bomb, or anchors reused far beyond what "
                "a config needs"), line
    return None


def load_yaml(text: str, loader: type = SAFE_LOADER) -> Any:
    """The YAML text as Python values, the aliases measured before anything is built.

    Raises `AliasRefused` (a `yaml.YAMLError`) for a document `alias_problem` refuses, and
    whatever the parser raises for invalid YAML."""
    reader = loader(text)
    try:
        root = reader.get_single_node()
        if root is None:
            return None
        # An alias needs an anchor, and an anchor is written `&name`: a text without `&`
        # (most machine-written configs) has none, and its graph is a tree worth no walk.
        found = alias_problem(root) if "&" in text else None
        if found is not None:
            raise AliasRefused(*found)
        return reader.construct_document(root)
    finally:
        reader.dispose()


class AliasRefused(yaml.YAMLError):
    """A document whose aliases `alias_problem` refuses."""

    def __init__(self, found: str, line: int | None) -> None:
        super().__init__(found)
        self.found, self.line = found, line


def read_yaml(
    text: str, where: str, title: str, loader: type = SAFE_LOADER, *, text_if_invalid: bool = False
) -> Any:
    """YAML text as Python values, or one InputError naming `where` (and the line): invalid
    YAML, an alias bomb or an anchor used inside itself, nesting beyond the reader's limit.
    The one reader of every YAML text a user hands over (campaign, override, GPU catalog,
    Axolotl). `text_if_invalid`: text that is not YAML is itself the value (an override)."""
    try:
        return load_yaml(text, loader)
    except AliasRefused as exc:
        fix = (SELF_REFERENCE_FIX if exc.found == SELF_REFERENCE else
               f"write the values out or reuse fewer anchors: tunepilot reads at most "
               f"{MAX_ALIAS_VALUES:,} values added by aliases and {MAX_ALIASES:,} alias uses")
        at = f"{where}:{exc.line}" if exc.line else where
        raise input_error(at, exc.found, fix, title=title) from None
    except RecursionError:
        raise _too_deep(where, title) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}" if mark else where
        if "nesting depth" in str(getattr(exc, "problem", "")):  # libyaml's own depth limit
            raise _too_deep(at, title) from None
        if text_if_invalid:
            return text
        raise input_error(at, f"not valid YAML ({getattr(exc, 'problem', exc)})",
                          "fix the YAML syntax on that line (indentation, quoting, brackets)",
                          title=title) from None  # fmt: skip


def _too_deep(where: str, title: str) -> Exception:
    return input_error(where, "nested too deeply to read (beyond the YAML reader's recursion "
                       "limit)", "these files are a few levels of mappings; flatten the deep "
                       "value", title=title)  # fmt: skip


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path of a YAML mapping to its 1-based line, for error messages. Called on
    a text `read_yaml` accepted; an alias is not followed (its key's line is the alias's)."""
    index: dict[tuple[str, ...], int] = {}
    try:
        root = yaml.compose(text, Loader=SAFE_LOADER)
    except yaml.YAMLError:
        return index
    if root is None:
        return index
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                child = (*path, str(key_node.value))
                index[child] = key_node.start_mark.line + 1
                stack.append((value_node, child))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                index[(*path, str(i))] = item.start_mark.line + 1
                stack.append((item, (*path, str(i))))
    return index
