"""The GPU catalog (L1, L3): cards a user may rent, their memory, backend, public peak
throughput per precision, memory bandwidth and prices.

The shipped file (`tunepilot/sizing/gpus.yaml`) lists common cards and machines with the
vendor's dense peak TFLOPS and the datasheet each figure comes from. A precision a card does
not list is one it cannot compute in (a T4 has no bf16): the per-card verdict refuses a step
that needs it (`sizing.fit`). Prices are left empty: only the user knows what their provider
charges, and a made-up price would make the plan's cost look like a fact. The share of the
peak a fine-tuning step reaches is not public either: it is a model calibrated on published
measurements (`sizing.throughput`); `assumed_mfu` (file-wide) or `mfu` (per card) replace it
with the user's own figure.

A user passes their own file with the same shape; unknown keys are errors that name the key
path and line, like the campaign file (STYLE practice 5).
"""

from __future__ import annotations

import difflib
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from tunepilot.campaign.loading import key_lines, read_yaml
from tunepilot.errors import InputError, Problem, input_error

GIB = 1024**3
Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "int8"]


class GpuCard(BaseModel):
    """One card as rented: memory per GPU, backend, dense peak TFLOPS per precision, memory
    bandwidth, the datasheet they come from, package prices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    memory_gib: float = Field(gt=0, description="Memory per GPU as the device reports it.")
    backend: Literal["cuda", "rocm"]
    peak_tflops: dict[Precision, float] = Field(
        min_length=1, description="Vendor's dense peak per precision (no sparsity), TFLOPS."
    )
    bandwidth_gb_s: float = Field(gt=0, description="Peak memory bandwidth, GB/s.")
    source: str = Field(min_length=1, description="Datasheet the figures come from.")
    arch: str | None = Field(
        default=None, description="Compute architecture the software stack must target "
        "(sm_80, gfx942): what the re-pilot's environment gate checks the torch build for."
    )
    stack: str | None = Field(
        default=None, description="The oldest CUDA or ROCm release (and PyTorch build) that "
        "supports the card, with its source."
    )
    gpus: int = Field(default=1, ge=1, description="GPUs in one rented machine.")
    prices: dict[int, float | None] = Field(
        default_factory=lambda: {3: None, 7: None, 30: None},
        description="Price of a package of N days for the whole machine; null = fill it in.",
    )
    price_per_hour: float | None = Field(
        default=None,
        ge=0,
        description="The machine's hourly price, used for a null package.",
    )
    mfu: float | None = Field(
        default=None, gt=0, le=1,
        description="Your own share of the peak on this card; replaces the calibrated model.",
    )  # fmt: skip

    @field_validator("peak_tflops")
    @classmethod
    def _positive_peaks(cls, value: dict[str, float]) -> dict[str, float]:
        for precision, tflops in value.items():
            if not tflops > 0:
                raise ValueError(f"peak {tflops} TFLOPS for {precision}: use a number > 0")
        return value

    @property
    def bf16(self) -> bool:
        """Whether the card computes in bfloat16 (T4 does not)."""
        return "bf16" in self.peak_tflops

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precisions the card computes in: those its datasheet gives a peak for."""
        return tuple(self.peak_tflops)

    @property
    def machine_bytes(self) -> int:
        """Memory of the whole machine (every GPU of it)."""
        return self.memory_bytes * self.gpus

    def peak_flops(self, precision: str) -> float | None:
        """Peak dense FLOP/s for a step computed in `precision` (fp32 autocast-free matmuls run
        on the fp32 units: PyTorch leaves TF32 off for matmuls unless asked), or None."""
        tflops = self.peak_tflops.get(precision)  # type: ignore[call-overload]
        return tflops * 1e12 if tflops is not None else None

    def package_price(self, days: int) -> float | None:
        """The package's price, or the hourly price x its hours, or None (not filled in)."""
        price = self.prices.get(days)
        if price is None and self.price_per_hour is not None:
            return self.price_per_hour * days * 24
        return price

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


class Catalog(BaseModel):
    """The whole file: the two labelled assumptions and the cards."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    assumed_mfu: float | None = Field(
        default=None, gt=0, le=1,
        description="Your own share of the peak a fine-tuning step reaches on every card; "
        "unset: the model calibrated on published measurements (sizing.throughput).",
    )  # fmt: skip
    assumed_disk_gb_s: float = Field(
        gt=0, description="Assumption: disk read/write speed for checkpoints and exports."
    )
    cards: list[GpuCard] = Field(min_length=1)
    _source: str = PrivateAttr(default="the GPU catalog")

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

    @property
    def source(self) -> str:
        """The file this catalog was read from."""
        return self._source

    def mfu(self, card: GpuCard) -> float | None:
        """The user's own utilisation for `card` (its own, else the file's), or None: then the
        calibrated model decides (`sizing.throughput`)."""
        return card.mfu if card.mfu is not None else self.assumed_mfu

    def card(self, name: str) -> GpuCard:
        """The card called `name` (case-insensitive), or an InputError naming the catalog file,
        a did-you-mean and how to add the card."""
        for card in self.cards:
            if card.name.lower() == name.strip().lower():
                return card
        names = [c.name for c in self.cards]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.4)
        hint = f"did you mean `{close[0]}`? " if close else ""
        raise input_error(
            self.source,
            f"no card `{name}` in the GPU catalog",
            f"{hint}use one of: {', '.join(names)}; or copy this file, add `{name}` with its "
            "memory_gib, backend, peak_tflops, bandwidth_gb_s and source, and pass it with "
            "--catalog",
            title="unknown GPU",
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
    title = f"invalid GPU catalog {source}"
    if not source.is_file():
        raise input_error(str(source), "no such catalog file", "give the path to a gpus.yaml",
                          title=title)  # fmt: skip
    try:
        text = source.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise input_error(str(source), "not a text file", "pass a YAML file shaped like the "
                          f"shipped {default_catalog_path()}", title=title) from None  # fmt: skip
    raw = read_yaml(text, str(source), title)
    if not isinstance(raw, dict):
        raise input_error(str(source), "the top level is not a mapping",
                          f"start from the shipped {default_catalog_path()}",
                          title=title)  # fmt: skip
    try:
        catalog = Catalog.model_validate(raw)
    except ValidationError as exc:
        lines = key_lines(text)
        problems = list(dict.fromkeys(_problem(e, str(source), lines) for e in exc.errors()))
        raise InputError(problems, title=f"invalid GPU catalog {source}") from None
    catalog._source = str(source)
    return catalog
