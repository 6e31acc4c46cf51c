"""Done-when of chat-format data: one campaign on the tiny chat Llama runs
data show -> data audit -> pilot -> run -> export -> verify through the real CLI.

Slow (a pilot and a run in child processes); the encoding and loss mask have fast tests in
test_chat_data.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]


def cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*TUNEPILOT, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=900, check=False)  # fmt: skip


def write_chat_campaign(folder: Path, model: Path, n: int = 40) -> Path:
    """ShareGPT-shaped rows: a user asks about an order, the assistant answers in one fixed
    style, the user thanks, the assistant closes."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        order = 10000 + i * 37
        rows.append({
            "conversation_id": f"conv-{i:03d}",
            "conversations": [
                {"from": "system", "value": "answer in one short line"},
                {"from": "human", "value": f"where is my order {order}?"},
                {"from": "gpt", "value": f"order {order}: shipped"},
                {"from": "human", "value": "thanks"},
                {"from": "gpt", "value": "glad to help"},
            ],
        })  # fmt: skip
    (folder / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    spec = {
        "name": "chat-style",
        "hypothesis": {"behaviour": "answer order questions in the house style", "task": "format"},
        # full fine-tuning: a random tiny model needs more than a rank-4 adapter to overfit (D7)
        "model": {"name_or_path": str(model), "method": "full"},
        "data": {
            "file": "chats.jsonl",
            "fields": {"id": "conversation_id", "group": "conversation_id"},
            "chat": {"field_messages": "conversations",
                     "message_property_mappings": {"role": "from", "content": "value"},
                     "assistant_turns": "all"},
            "split": {"policy": "group", "validation": 0.2, "test": 0.1},
            "max_length": 96,
        },
        "training": {"microbatch": 4, "accumulation": 1, "budget": {"updates": 6}, "lr": 1e-3,
                     "eval_every": 3, "eval_batch_size": 8, "max_new_tokens": 12},
    }  # fmt: skip
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.slow
def test_h1_chat_campaign_runs_show_audit_pilot_run_export_verify(
    tiny_chat_llama_dir: Path, tmp_path: Path
) -> None:
    campaign = write_chat_campaign(tmp_path / "camp", tiny_chat_llama_dir)
    root = campaign.parent

    show = cli("data", "show", campaign, "-n", "1", "--json", cwd=root)
    assert show.returncode == 0, show.stderr
    sample = json.loads(show.stdout)["samples"][0]
    loss_text = "".join(t["token"] for t in sample["tokens"] if t["loss"])
    assert loss_text.startswith("order ") and loss_text.endswith("shipped</s>glad to help</s>")
    assert sample["loss_positions_from"] == "generation tags"

    audit = cli("data", "audit", campaign, "--json", cwd=root)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    checks = {f["check"]: f["verdict"] for f in json.loads(audit.stdout)["findings"]}
    assert checks["same user turns across splits"] == "PASS"
    assert checks["group leakage"] == "PASS"

    pilot = cli("pilot", campaign, "--json", cwd=root)
    assert pilot.returncode in (0, 1), pilot.stderr
    rows = {r["phase"]: r["verdict"] for r in json.loads(pilot.stdout)["rows"]}
    assert "FAIL" not in rows.values(), rows

    run = cli("run", campaign, "--json", cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    [outcome] = json.loads(run.stdout)
    assert outcome["status"] == "completed", outcome
    run_id = outcome["run_id"]

    export = cli("export", run_id, campaign, cwd=root)
    bundle = root / "exports" / run_id
    fails = json.loads((bundle / "metrics.json").read_text())["metrics"]["fails_guards"]
    assert export.returncode == (1 if fails else 0), export.stdout + export.stderr
    controls = json.loads((bundle / "control.json").read_text())
    assert controls["inputs"][0]["prompt_text"].endswith("<|assistant|>\n")
    card = (bundle / "README.md").read_text()
    assert "apply_chat_template" in card and str(root) not in card and "/tmp/" not in card  # L5
    verify = cli("verify", bundle, "--json", cwd=root)
    assert verify.returncode == 0, verify.stdout + verify.stderr
