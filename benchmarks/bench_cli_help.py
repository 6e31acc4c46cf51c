"""`tunepilot --help` must answer in under 0.3 s (it must never import torch).

Prints the median of 7 cold runs of the real console script and the import of torch for
comparison: the figure the lazy-import rule protects.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    script = shutil.which("tunepilot") or str(Path(sys.executable).parent / "tunepilot")
    runs = [timed([script, "--help"]) for _ in range(7)]
    torch_import = timed([sys.executable, "-c", "import torch"])
    median = statistics.median(runs)
    verdict = "PASS" if median < 0.3 else "FAIL"
    print(f"tunepilot --help: median {median:.3f} s over 7 runs (goal < 0.3 s) {verdict}; "
          f"`import torch` alone: {torch_import:.2f} s")
    sys.exit(0 if verdict == "PASS" else 1)


if __name__ == "__main__":
    main()
