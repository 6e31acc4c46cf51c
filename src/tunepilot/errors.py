"""Bad input, reported the way a user can act on it.

Every problem names *where* (a file and line, or a dotted campaign key), *what was found* and
*the fix*. Problems are collected and raised together so a user fixes a file in one pass
instead of one error per run. The CLI turns an `InputError` into exit code 2.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


# -- storage faults (a full disk, a file-size limit, a read-only folder) ----------------------

_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
# Libraries written in Rust (safetensors, tokenizers) and SQLite do not raise OSError: they
# carry the OS error in their message, so the message is the only evidence there is.
_NO_SPACE_TEXT = ("no space left", "file too large", "disk quota", "database or disk is full",
                  "os error 28", "os error 27", "os error 122")  # fmt: skip
_IO_TEXT = ("disk i/o error", "input/output error", "os error 5")
_READ_ONLY_TEXT = ("read-only file system", "readonly database", "os error 30")


def storage_fault(exc: BaseException) -> str | None:
    """'no space', 'read-only' or 'I/O' when `exc` is a storage fault rather than a bug."""
    code = exc.errno if isinstance(exc, OSError) else None
    text = str(exc).lower()
    if code in _NO_SPACE_ERRNOS or any(t in text for t in _NO_SPACE_TEXT):
        return "no space"
    if code == errno.EROFS or any(t in text for t in _READ_ONLY_TEXT):
        return "read-only"
    if code == errno.EIO or any(t in text for t in _IO_TEXT):
        return "I/O"
    return None


def describe_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def space_facts(path: Path) -> str:
    """What limits writing under `path`: free space on its disk and the file-size limit."""
    import resource
    import shutil

    facts = []
    folder = next((p for p in (path, *path.parents) if p.is_dir()), None)
    if folder is not None:
        facts.append(f"{describe_bytes(shutil.disk_usage(folder).free)} free on its disk")
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        facts.append(f"files limited to {describe_bytes(soft)} by the file-size limit (ulimit -f)")
    return ", ".join(facts)


def storage_error(
    exc: BaseException, path: str | Path, needed: int | None = None, then: str = ""
) -> InputError | None:
    """The sentence for a storage fault while writing `path` (None for any other error).

    `needed` is the size the write needed, when known; `then` is what to run once it is fixed.
    """
    fault = storage_fault(exc)
    if fault is None:
        return None
    path = Path(path)
    again = f", then {then}" if then else ", then run the command again"
    if fault == "read-only":
        return input_error(
            str(path), f"the folder is read-only ({exc})",
            f"make it writable (`chmod -R u+w {path.parent}`) or copy the campaign folder "
            f"(`cp -a`) and work in the copy{again}; nothing recorded so far is lost",
            title="cannot write: read-only folder",
        )  # fmt: skip
    need = f"it needs about {describe_bytes(needed)}" if needed else "its size is unknown"
    found = ("the disk is full or a file-size limit was reached" if fault == "no space"
             else "a disk I/O error (often a full disk or a file-size limit)")  # fmt: skip
    return input_error(
        str(path), f"{found} ({exc}); {need}; {space_facts(path)}",
        f"free disk space or raise the limit (`ulimit -f unlimited`){again}; "
        "nothing recorded so far is lost",
        title="cannot write: out of space",
    )  # fmt: skip


@contextmanager
def writing(path: str | Path, needed: int | None = None, then: str = "") -> Iterator[None]:
    """Turn a storage fault inside the block into `storage_error`'s sentence (exit 2)."""
    try:
        yield
    except InputError:
        raise
    except Exception as exc:
        err = storage_error(exc, path, needed, then)
        if err is None:
            raise
        raise err from None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and `os.replace`.

    A reader (or a browser reloading a page) never sees half a file; a full disk or a
    file-size limit leaves the previous file (or none) and no temporary behind, and is
    `storage_error`'s sentence naming `path` (exit 2)."""
    import os

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with writing(path, len(text.encode("utf-8"))):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):  # a read-only folder refuses even the unlink of nothing
            tmp.unlink(missing_ok=True)
        raise


class Stopped(Exception):
    """The process was asked to stop (SIGTERM, Ctrl-C) and stopped cleanly, its state saved.

    Not a failure and not bad input: the command line exits 128 + the signal number, as a
    shell reports a process ended by that signal, after printing `message`.
    """

    def __init__(self, message: str, signal_name: str) -> None:
        super().__init__(message)
        self.message, self.signal_name = message, signal_name

    @property
    def exit_code(self) -> int:
        import signal

        return 128 + int(signal.Signals[self.signal_name]) if self.signal_name else 130


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """A JSON file written whole or not at all (`write_text_atomic`)."""
    import json

    write_text_atomic(path, json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
