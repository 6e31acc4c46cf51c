"""Which card to rent (L2): the smallest that fits the configured step with headroom, and only
where a pilot's stack gates passed on that card's backend (B1)."""

from __future__ import annotations

from typing import Any


def smallest_fit(sheet: dict[str, Any]) -> dict[str, Any] | None:
    """The row of the single-machine card with the least memory that fits the configured step
    with headroom: the cheapest class of card that does the job (prices are the user's)."""
    fitting = [r for r in sheet["rows"] if r["configured"]["verdict"] == "PASS"]
    return min(fitting, key=lambda r: (r["gpus"], r["memory_bytes"]), default=None)


def recommendation(
    sheet: dict[str, Any], stack_backends: set[str]
) -> tuple[dict[str, Any] | None, str]:
    """(row, sentence): the smallest card that fits, recommended only where a pilot's stack
    gates passed on that card's backend (L2, B1)."""
    row = smallest_fit(sheet)
    if row is None:
        return None, (
            "no card of the catalog fits the configured step with headroom: see the largest "
            "microbatch and base dtype columns"
        )
    if row["backend"] not in stack_backends:
        checked = (
            f"the pilot's stack gates passed on {', '.join(sorted(stack_backends))}, not on "
            f"{row['backend']}" if stack_backends
            else f"no pilot has passed the stack gates on {row['backend']}"
        )  # fmt: skip
        return None, (
            f"the {row['card']} is the smallest card that fits, but not recommended yet: "
            f"{checked}; run `tunepilot pilot` on the {row['card']} first (L2, B1)"
        )
    return row, f"the {row['card']}: it fits with {row['configured']['headroom']:.0%} headroom"
