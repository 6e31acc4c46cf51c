"""Bad input, reported the way a user can act on it.

Every problem names *where* (a file and line, or a dotted campaign key), *what was found* and
*the fix*. Problems are collected and raised together so a user fixes a file in one pass
instead of one error per run. The CLI turns an `InputError` into exit code 2.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input."""

    where: str  # "data/train.jsonl:14" or "training.lr" or "campaign.yaml:7 training.lr"
    found: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: {self.found}. Fix: {self.fix}"


@dataclass
class InputError(Exception):
    """Raised with every problem found, never only the first one."""

    problems: list[Problem] = field(default_factory=list)
    title: str = "invalid input"

    def __post_init__(self) -> None:
        super().__init__(self.__str__())

    def __str__(self) -> str:
        lines = [f"{self.title} ({len(self.problems)} problem(s)):"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


def input_error(where: str, found: str, fix: str, title: str = "invalid input") -> InputError:
    """Shorthand for the common single-problem case."""
    return InputError([Problem(where, found, fix)], title=title)


MAX_PROBLEMS = 50


@dataclass
class ProblemList:
    """Collects problems up to MAX_PROBLEMS and counts the rest, so one run shows them all."""

    where: str
    problems: list[Problem] = field(default_factory=list)
    hidden: int = 0

    @property
    def count(self) -> int:
        return len(self.problems) + self.hidden

    def add(self, where: str, found: str, fix: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(where, found, fix))
        else:
            self.hidden += 1

    def raise_if_any(self, title: str) -> None:
        more = [Problem(self.where, f"and {self.hidden} more problem(s)", "fix the ones above")]
        if self.problems:
            raise InputError(self.problems + (more if self.hidden else []), title=title)


# What a corrupt, truncated or hand-edited file raises while it is parsed and read: bad JSON or
# text (ValueError covers JSONDecodeError and UnicodeDecodeError), a missing or mistyped entry,
# nesting deep enough to exhaust the parser.
CONTENT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError,
)  # fmt: skip


@contextmanager
def reading(
    path: object, fix: str, *, what: str = "content", title: str = "unreadable file",
    also: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:  # fmt: skip
    """Turn what a file's content raises inside the block into an InputError that names the
    file and the fix. One place for every file tunepilot reads back (state.json, MANIFEST.json,
    config.resolved.yaml ...), so a damaged file is bad input (exit 2), never a traceback.
    Keep the block to parsing and reading fields: a bug elsewhere must not pass as bad input."""
    try:
        yield
    except (*CONTENT_ERRORS, *also) as exc:
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        found = f"an unreadable {what} ({type(exc).__name__}{': ' + detail if detail else ''})"
        raise input_error(str(path), found, fix, title=title) from None
