"""The GPU catalog (L1, L3): cards a user may rent, their memory, backend, speed and prices.

The shipped file (`tunepilot/sizing/gpus.yaml`) lists common cards with prices left empty:
only the user knows what their provider charges, and a made-up price would make the plan's
cost look like a fact. Relative speeds are labelled assumptions for the same reason; the
plan uses them only to scale a step time measured on one card to another and says so.

A user passes their own file with the same shape; unknown keys are errors that name the key
path and line, like the campaign file (STYLE practice 5).
"""

from __future__ import annotations

import difflib
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tunepilot.campaign.loading import key_lines
from tunepilot.errors import InputError, Problem, input_error
from tunepilot.measure.memory import human_bytes
from tunepilot.verdict import Verdict

GIB = 1024**3


class GpuCard(BaseModel):
    """One card as rented: memory per GPU, backend, bf16, a relative speed, package prices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    memory_gib: float = Field(gt=0, description="Memory per GPU as the device reports it.")
    backend: Literal["cuda", "rocm"]
    bf16: bool
    relative_speed: float = Field(gt=0, description="Assumption: training throughput, A100=1.")
    gpus: int = Field(default=1, ge=1, description="GPUs in one rented machine.")
    prices: dict[int, float | None] = Field(
        default_factory=lambda: {3: None, 7: None, 30: None},
        description="Price of a package of N days for the whole machine; null = fill it in.",
    )

    @field_validator("prices")
    @classmethod
    def _positive_days_and_prices(cls, value: dict[int, float | None]) -> dict[int, float | None]:
        for days, price in value.items():
            if days < 1:
                raise ValueError(f"package of {days} days: use a whole number of days >= 1")
            if price is not None and price < 0:
                raise ValueError(f"price {price} for {days} days is negative")
        return dict(sorted(value.items()))

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def fit(
        self, peak_bytes: float, min_headroom: float, precision: str = "fp32", gpus: int = 1
    ) -> dict[str, Any]:
        """Verdict of a predicted per-GPU peak on this card; headroom = share left free (L1)."""
        headroom = 1.0 - peak_bytes / self.memory_bytes
        if precision == "bf16" and not self.bf16:
            verdict, why = Verdict.FAIL, f"{self.name} has no bf16"
        elif headroom >= min_headroom:
            verdict, why = Verdict.PASS, f"fits with {headroom:.0%} headroom"
        elif headroom >= 0:
            verdict, why = Verdict.WARN, f"fits with only {headroom:.0%} headroom"
        else:
            short = human_bytes(-headroom * self.memory_bytes)
            verdict, why = (
                Verdict.FAIL,
                f"needs {human_bytes(peak_bytes)}, {short} more than it has",
            )
        if gpus > 1:
            why += f" (per GPU, on a machine with {gpus} of them)"
        return {"verdict": str(verdict), "headroom": round(headroom, 4), "sentence": why}


class Catalog(BaseModel):
    """The whole file: the basis of the speeds (in words) and the cards."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speed_basis: str = Field(min_length=1)
    cards: list[GpuCard] = Field(min_length=1)

    @field_validator("cards")
    @classmethod
    def _unique_names(cls, cards: list[GpuCard]) -> list[GpuCard]:
        seen: set[str] = set()
        for card in cards:
            key = card.name.lower()
            if key in seen:
                raise ValueError(f"card `{card.name}` is listed twice; keep one entry")
            seen.add(key)
        return cards

    def card(self, name: str) -> GpuCard:
        """The card called `name` (case-insensitive), or an InputError with a did-you-mean."""
        for card in self.cards:
            if card.name.lower() == name.strip().lower():
                return card
        names = [c.name for c in self.cards]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.4)
        hint = f"did you mean `{close[0]}`? " if close else ""
        raise input_error(
            "rental.gpu",
            f"no card `{name}` in the GPU catalog",
            f"{hint}use one of: {', '.join(names)}, or add it to your catalog file",
        )


def default_catalog_path() -> Path:
    """The catalog shipped with tunepilot (copy it, edit the prices, pass it back)."""
    return Path(str(files("tunepilot").joinpath("sizing", "gpus.yaml")))


def _problem(err: dict[str, Any], source: str, lines: dict[tuple[str, ...], int]) -> Problem:
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc) or "(top level)"
    line = next((lines[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in lines), None)
    where = f"{source}:{line} {key}" if line else f"{source} {key}"
    if err["type"] == "extra_forbidden":
        parent = GpuCard if "cards" in loc[:1] and len(loc) > 2 else Catalog
        allowed = ", ".join(parent.model_fields)
        return Problem(where, f"unknown key `{loc[-1]}`", f"remove it; allowed keys: {allowed}")
    if err["type"] == "missing":
        return Problem(where, "a required key is missing", f"add `{loc[-1]}`")
    msg = str(err["msg"]).removeprefix("Value error, ")
    return Problem(where, f"{msg} (found {err.get('input')!r})"[:200], "correct the value")


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read and validate a catalog; all problems are raised together as one InputError."""
    source = Path(path) if path is not None else default_catalog_path()
    if not source.is_file():
        raise input_error(str(source), "no such catalog file", "give the path to a gpus.yaml")
    text = source.read_text(encoding="utf-8")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else str(source)
        raise input_error(where, f"not valid YAML ({exc})", "fix the YAML syntax") from None
    if not isinstance(raw, dict):
        raise input_error(str(source), "the top level is not a mapping", "see the shipped file")
    try:
        return Catalog.model_validate(raw)
    except ValidationError as exc:
        lines = key_lines(text)
        problems = list(dict.fromkeys(_problem(e, str(source), lines) for e in exc.errors()))
        raise InputError(problems, title=f"invalid GPU catalog {source}") from None


def speed_ratio(catalog: Catalog, measured_on: str, target: str) -> tuple[float, bool]:
    """(target speed / measured speed, is_estimate). The same card is a measurement (1.0,
    False); anything else is scaled through the catalog's assumed speeds and is an estimate."""
    if measured_on.strip().lower() == target.strip().lower():
        return 1.0, False
    return catalog.card(target).relative_speed / catalog.card(measured_on).relative_speed, True
