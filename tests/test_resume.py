"""R1: resume in a new process continues the identical curve and ends on identical weights.

The reference run trains 20 updates in this process. The others stop (or are killed with
SIGKILL) part-way and are resumed by a *fresh Python process* that rebuilds the model from
the saved Hugging Face folder and calls `train(resume=...)`: nothing survives but the files.
LoRA dropout is on, bucketing is on, the schedule has warmup and cosine decay and the run
crosses epoch boundaries, so the generators, the sampler position and the lr must all be
restored for the comparison to hold bit for bit.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunepilot.model.tiny import DEFAULT_CORPUS
from tunepilot.tasks.base import IGNORE_INDEX

torch = pytest.importorskip("torch")

SETTINGS = {
    "microbatch": 2, "accumulation": 3, "budget": {"updates": 20}, "lr": 5e-3,
    "scheduler": "cosine", "warmup_updates": 3, "bucket_by_length": True, "seed": 11,
    "checkpoint_every": 5, "keep_last_checkpoints": 2,
}  # fmt: skip

# The child: everything it knows comes from files (spec.json, the model folder, the data).
CHILD = r"""
import json, sys, time
from pathlib import Path
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from tunepilot.campaign import TrainingSettings
from tunepilot.tasks.base import Encoded
from tunepilot.train.loop import train

spec = json.loads(Path(sys.argv[1]).read_text())
torch.set_num_threads(spec["threads"])
data = [Encoded(**e) for e in json.loads(Path(spec["data"]).read_text())]
torch.manual_seed(0)
base = AutoModelForCausalLM.from_pretrained(spec["model_dir"])
model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                        target_modules=["q_proj", "v_proj"]))
settings = TrainingSettings(**spec["settings"])
slow = (lambda record: time.sleep(spec["sleep"])) if spec["sleep"] else None
result = train(model, data, settings, Path(spec["run_dir"]), kind="causal_lm",
               pad_id=spec["pad_id"], resume=spec["resume"] and Path(spec["resume"]),
               stop_after=spec["stop_after"], on_update=slow, progress=False)
print(json.dumps({"status": result.status, "updates": result.updates}))
"""


@pytest.fixture(scope="module")
def workspace(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The data as a JSON file the child can read, and the reference 20-update run."""
    from dataclasses import asdict

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunepilot.campaign import TrainingSettings
    from tunepilot.tasks.base import Encoded
    from tunepilot.train.loop import train

    root = tmp_path_factory.mktemp("resume")
    tok = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    data = []
    for i in range(22):  # 22 examples, 6 per update: 4 updates per epoch, the last partial
        text = " ".join(DEFAULT_CORPUS[(i + k) % len(DEFAULT_CORPUS)] for k in range(1 + i % 3))
        ids = tok(text)["input_ids"][: 5 + (i * 7) % 45] + [tok.eos_token_id]
        data.append(Encoded(f"ex{i}", ids, [IGNORE_INDEX] * 2 + ids[2:], 2, False, False, len(ids)))
    (root / "data.json").write_text(json.dumps([asdict(e) for e in data]))
    (root / "child.py").write_text(CHILD)

    def run_here(run_dir: Path, **kw):
        """The same model and call as the child's, in this process."""
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1,
                                                target_modules=["q_proj", "v_proj"]))  # fmt: skip
        return train(model, data, TrainingSettings(**SETTINGS), run_dir, kind="causal_lm",
                     pad_id=tok.pad_token_id, progress=False, **kw)  # fmt: skip

    reference = root / "reference"
    result = run_here(reference)
    assert result.status == "completed" and result.updates == 20
    return {"root": root, "pad_id": tok.pad_token_id, "model_dir": str(tiny_llama_dir),
            "reference": reference, "run_here": run_here}  # fmt: skip


def spec_for(ws: dict, run_dir: Path, **kw) -> Path:
    spec = {
        "data": str(ws["root"] / "data.json"), "model_dir": ws["model_dir"],
        "pad_id": ws["pad_id"], "run_dir": str(run_dir), "threads": torch.get_num_threads(),
        "settings": SETTINGS, "resume": None, "stop_after": None, "sleep": 0.0,
    } | kw  # fmt: skip
    path = run_dir.parent / f"spec-{run_dir.name}-{len(list(run_dir.parent.iterdir()))}.json"
    path.write_text(json.dumps(spec))
    return path


def child(ws: dict, run_dir: Path, **kw) -> dict:
    done = subprocess.run(
        [sys.executable, str(ws["root"] / "child.py"), str(spec_for(ws, run_dir, **kw))],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(x["update"], x["loss"], x["lr"]) for x in lines]


def assert_same_final_state(run_dir: Path, reference: Path) -> None:
    """Bitwise: every adapter tensor and every AdamW moment of the step-20 checkpoint."""
    from safetensors.torch import load_file

    for name in ("adapter_model.safetensors", "optimizer.safetensors"):
        mine = load_file(str(run_dir / "checkpoints" / "step-000020" / name))
        theirs = load_file(str(reference / "checkpoints" / "step-000020" / name))
        assert mine.keys() == theirs.keys() and len(mine) >= 8
        for key in mine:
            assert torch.equal(mine[key], theirs[key]), f"{name}:{key}"


def test_r1_stop_at_10_and_resume_in_a_new_process_gives_the_identical_run(
    workspace: dict,
) -> None:
    run_dir = workspace["root"] / "paused"
    first = workspace["run_here"](run_dir, stop_after=10)
    assert (first.status, first.updates) == ("paused", 10)
    state = json.loads((run_dir / "checkpoints" / "step-000010" / "state.json").read_text())
    assert state["update"] == 10 and state["sampler"]["epoch"] == 2  # mid-run, mid-epoch
    assert state["sampler"]["position"] == 2

    second = child(workspace, run_dir, resume=str(run_dir / "checkpoints" / "step-000010"))
    assert second == {"status": "completed", "updates": 20}
    reference = curve(workspace["reference"])
    assert curve(run_dir) == reference  # steps, losses and learning rates, exactly
    assert reference[10][2] != reference[9][2]  # the lr really moves at the seam
    assert_same_final_state(run_dir, workspace["reference"])


def test_r1_sigkill_at_a_random_moment_then_resume_gives_the_identical_weights(
    workspace: dict,
) -> None:
    run_dir = workspace["root"] / "killed"
    settings = SETTINGS | {"checkpoint_every": 2}
    spec = spec_for(workspace, run_dir, settings=settings, sleep=0.08)
    proc = subprocess.Popen(
        [sys.executable, str(workspace["root"] / "child.py"), str(spec)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    first = run_dir / "checkpoints" / "step-000002" / "MANIFEST.json"
    deadline = time.monotonic() + 120
    while not first.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        assert time.monotonic() < deadline, "the child never wrote its first checkpoint"
        time.sleep(0.01)
    delay = random.uniform(0.0, 0.6)  # 20 updates x 0.08 s: the run is still going
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"finished before the kill (delay {delay:.2f}s)"
    if proc.stderr:
        proc.stderr.close()
    written = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert not (run_dir / "checkpoints" / "step-000020").exists(), written

    resumed = child(workspace, run_dir, settings=settings, resume=str(run_dir))
    assert resumed == {"status": "completed", "updates": 20}, f"delay {delay:.2f}s"
    assert curve(run_dir) == curve(workspace["reference"]), f"delay {delay:.2f}s"
    assert_same_final_state(run_dir, workspace["reference"])
