"""On a CUDA (or ROCm) machine: what the CPU tests cannot show of the recorded versions and the
per-phase memory rows (B2, S5). Run: `python benchmarks/gpu_versions_and_memory.py`.

1. The fingerprint names the collective library the torch build links (NCCL, or RCCL on ROCm)
   and the driver from the driver's own tool (nvidia-smi, amd-smi or rocm-smi).
2. A run's phase log on `cuda:0` records allocated and reserved bytes as separate counters,
   the first update's peak above the steady one's baseline (AdamW allocates its state there).

Prints one JSON object; exits 1 when a check fails, 0 when all pass, 2 without a GPU.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA/ROCm device visible"}))
        return 2
    from tunepilot.measure.env import fingerprint
    from tunepilot.measure.phase_log import PhaseLog, read_phase_rows

    fp = fingerprint()
    info = fp["torch"] or {}
    library = "rccl" if info.get("hip") else "nccl"
    checks = {
        f"{library} version recorded": bool(info.get(library)),
        "driver version recorded": bool(fp["driver"].get("version")),
    }
    run_dir = Path(tempfile.mkdtemp())
    log = PhaseLog.for_run(run_dir, "cuda:0")
    with log.phase("load"):
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for done in range(2):
        log.begin_update(done)
        loss = model(torch.randn(64, 2048, device="cuda")).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.end()
    rows = {r["phase"]: r for r in read_phase_rows(run_dir)}

    def reading(phase: str, counter: str) -> dict:
        return next(x for x in rows[phase]["readings"] if x["counter"] == counter)

    checks["allocated and reserved kept apart"] = all(
        rows[p]["counters"] == ["allocated", "reserved"] for p in rows)
    first, steady = reading("first update", "allocated"), reading("steady update", "allocated")
    checks["first update allocates the optimizer state"] = (
        first["peak_delta_bytes"] > steady["peak_delta_bytes"])
    print(json.dumps({"checks": checks, "torch": info, "driver": fp["driver"],
                      "rows": rows}, indent=2, default=str))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
