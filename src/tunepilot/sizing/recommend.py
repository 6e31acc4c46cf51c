"""Which machine to rent (L2): the cheapest (or, without prices, the smallest) that fits the
campaign, multi-GPU machines included, and only where a pilot's stack gates passed on that
machine's backend (B1).

A row is eligible only when its verdict is PASS (`sizing.fit`, the one verdict). Eligible rows
are ranked by one explicit rule (`rank_key`), said in the sheet:

1. the price of the package the plan chose for that machine, where the catalog has it (priced
   rows before unpriced ones: an unknown price is not a low one);
2. then the machine's memory, all its GPUs together, in whole GiB (79.1 and 79.2 GiB are one
   class of card, whatever the driver reserves);
3. then its peak FLOPS for the step's precision, all GPUs together (less is the smaller card);
4. then the name, so two identical rows always come out in the same order.
"""

from __future__ import annotations

import math
from typing import Any

GIB = 2**30


def rank_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """The ranking rule above as a sort key (smaller first)."""
    price = (row.get("package") or {}).get("price")
    memory = math.floor(row["memory_bytes"] * row["gpus"] / GIB)
    return (price is None, price or 0.0, memory, row.get("machine_peak_flops") or 0.0, row["card"])


def ranking_rule() -> str:
    """The rule in one sentence, for the sheet."""
    return ("machines that PASS, ranked by the chosen package's price where the catalog has "
            "one (priced first), then by the machine's memory in whole GiB (all its GPUs), then "
            "by its peak FLOPS for the step's precision (less first), then by name")  # fmt: skip


def ranked(sheet: dict[str, Any]) -> list[dict[str, Any]]:
    """Every PASS row, best first by `rank_key`."""
    passing = [r for r in sheet["rows"] if r["configured"]["verdict"] == "PASS"]
    return sorted(passing, key=rank_key)


def smallest_fit(sheet: dict[str, Any]) -> dict[str, Any] | None:
    """The first row of the ranking: the cheapest machine that fits, or the smallest."""
    found = ranked(sheet)
    return found[0] if found else None


def recommendation(
    sheet: dict[str, Any], stack_backends: set[str]
) -> tuple[dict[str, Any] | None, str]:
    """(row, sentence): the first machine of the ranking, recommended only where a pilot's
    stack gates passed on that machine's backend (L2, B1)."""
    row = smallest_fit(sheet)
    if row is None:
        return None, (
            "no machine of the catalog fits the configured campaign with headroom: see each "
            "row's deciding phase, the largest microbatch and the base dtypes that fit"
        )
    price = (row.get("package") or {}).get("price")
    which = "cheapest" if price is not None else "smallest"
    layout = row["configured"].get("layout") or "one GPU"
    how = f" ({layout})" if row["gpus"] > 1 else ""
    if row["backend"] not in stack_backends:
        checked = (
            f"the pilot's stack gates passed on {', '.join(sorted(stack_backends))}, not on "
            f"{row['backend']}" if stack_backends
            else f"no pilot has passed the stack gates on {row['backend']}"
        )  # fmt: skip
        return None, (
            f"the {row['card']}{how} is the {which} machine that fits, but not recommended yet: "
            f"{checked}; run `tunepilot pilot` on the {row['card']} first (L2, B1)"
        )
    return row, (f"the {row['card']}{how}, the {which} machine that fits: "
                 f"{row['configured']['sentence']}")  # fmt: skip
