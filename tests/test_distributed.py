"""B3, B4, S7: data replicas on CPU with real torchrun processes (gloo), on a tiny Llama + LoRA.

Two processes x accumulation 4 must give the loss curve of one process x accumulation 8: the
sampler gives every update the same examples however it is split, and the loss is normalised
by the whole update's target count (S2). What is *not* identical is the float32 summation
order of the gradients (rank 0's four microbatches, rank 1's four, then the all-reduce or
reduce-scatter, against eight in a row), so the curves agree to a stated tolerance:
RTOL below. The gap measured on this machine is printed by the test (`-s`) and noted there.

The data is chosen so that the last update of every epoch holds a single microbatch: rank 1
has no share and runs the zero-weight "ghost" pass that keeps the collectives in step.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from tunepilot.model.tiny import DEFAULT_CORPUS
from tunepilot.tasks.base import IGNORE_INDEX

torch = pytest.importorskip("torch")

RTOL = 1e-5  # float32 summation order; measured max relative gap: see the test output
SETTINGS = {
    "microbatch": 2, "budget": {"updates": 6}, "lr": 5e-3, "scheduler": "cosine",
    "warmup_updates": 1, "seed": 5, "eval_every": 3, "checkpoint_every": 3,
    "keep_last_checkpoints": 3, "bucket_by_length": True,
}  # fmt: skip

# Every rank: build the same LoRA model, wrap it, train. Runs DDP, FSDP2, and FSDP2 paused
# after 3 updates then resumed from its checkpoint into a freshly built model.
CHILD = r"""
import json, os, sys
from pathlib import Path
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from tunepilot.campaign import TrainingSettings
from tunepilot.tasks.base import Encoded
from tunepilot.measure.phase_log import PhaseLog
from tunepilot.train import distributed
from tunepilot.train.loop import train

spec = json.loads(Path(sys.argv[1]).read_text())
ctx = distributed.init_process_group_from_env()
data = [Encoded(**e) for e in spec["data"]]
settings = TrainingSettings(**spec["settings"])
prompts = torch.tensor(spec["prompts"])

def build():
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(spec["model_dir"])
    dropout = spec.get("lora_dropout", 0.0)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["q_proj", "v_proj"])
    return get_peft_model(base, lora)

def evaluate(model):
    out = model(input_ids=prompts, labels=prompts)
    gen = model.generate(input_ids=prompts[:, :3], attention_mask=torch.ones_like(prompts[:, :3]),
                         max_new_tokens=4, do_sample=False, pad_token_id=spec["pad_id"])
    return {"loss": float(out.loss), "generated": gen.tolist()}

for name, strategy, stop_after, resume in spec["runs"]:
    run_dir = Path(spec["out"]) / name
    phases = PhaseLog.for_run(run_dir, ctx.device, ctx.rank, ctx.world_size)  # as the worker
    with phases.phase("load"):
        model = distributed.wrap_model(build(), strategy, ctx)
    result = train(model, data, settings, run_dir, kind="causal_lm", pad_id=spec["pad_id"],
                   evaluate=evaluate, rank=ctx.rank, world_size=ctx.world_size, progress=False,
                   stop_after=stop_after, resume=run_dir if resume else None, phases=phases)
    line = json.dumps({"rank": ctx.rank, "run": name, "status": result.status}) + "\n"
    os.write(1, line.encode())  # one write: the ranks share the pipe, lines must not interleave
distributed.shutdown(ctx)
from tunepilot.experiments.worker import exit_now
exit_now(0)
"""


def _examples(tokenizer) -> list:
    from tunepilot.tasks.base import Encoded

    data = []
    for i in range(18):  # 16 per update: 2 updates per epoch, the second a single microbatch
        text = " ".join(DEFAULT_CORPUS[(i + k) % len(DEFAULT_CORPUS)] for k in range(1 + i % 3))
        ids = tokenizer(text)["input_ids"][: 6 + (i * 7) % 40] + [tokenizer.eos_token_id]
        data.append(Encoded(f"ex{i}", ids, [IGNORE_INDEX] * 2 + ids[2:], 2, False, False, len(ids)))
    return data


def _curve(run_dir: Path, key: str = "loss") -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)[key] for line in lines]


def _relative_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The data, the spec the children read, and the 1-process x accumulation 8 reference."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunepilot.campaign import TrainingSettings
    from tunepilot.train.loop import train

    out = tmp_path_factory.mktemp("distributed")
    tok = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    data = _examples(tok)
    prompts = [d.input_ids[:6] for d in data[:3]]
    spec = {
        "model_dir": str(tiny_llama_dir), "data": [asdict(d) for d in data], "out": str(out),
        "settings": {**SETTINGS, "accumulation": 4}, "pad_id": tok.pad_token_id,
        "prompts": [p + [tok.pad_token_id] * (6 - len(p)) for p in prompts],
    }  # fmt: skip
    (out / "child.py").write_text(CHILD)

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(base, lora)
    settings = TrainingSettings(**{**SETTINGS, "accumulation": 8})
    ids = torch.tensor(spec["prompts"])

    def evaluate(model) -> dict:  # the child's, in this process
        gen = model.generate(
            input_ids=ids[:, :3],
            attention_mask=torch.ones_like(ids[:, :3]),
            max_new_tokens=4,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
        return {"loss": float(model(input_ids=ids, labels=ids).loss), "generated": gen.tolist()}

    train(model, data, settings, out / "single", kind="causal_lm", pad_id=tok.pad_token_id,
          evaluate=evaluate, progress=False)  # fmt: skip
    return {"out": out, "spec": spec}


def _launch(reference: dict, name: str, runs: list[list]) -> subprocess.CompletedProcess:
    out = reference["out"]
    (out / f"{name}.json").write_text(json.dumps({**reference["spec"], "runs": runs}))
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(out / "child.py"), str(out / f"{name}.json")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ddp(reference: dict) -> subprocess.CompletedProcess:
    """One torchrun launch, 2 ranks, DDP: the fast tier's distributed test (~10 s idle)."""
    return _launch(reference, "ddp", [["ddp", "ddp", None, False]])


@pytest.fixture(scope="module")
def fsdp(reference: dict) -> subprocess.CompletedProcess:
    """FSDP2, then FSDP2 paused after 3 updates and resumed into a freshly built model."""
    return _launch(reference, "fsdp", [
        ["fsdp", "fsdp", None, False], ["fsdp-resumed", "fsdp", 3, False],
        ["fsdp-resumed", "fsdp", None, True],
    ])  # fmt: skip


STRATEGIES = ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_b3_b4_two_ranks_exit_zero_without_a_gloo_abort(request, strategy):
    launched = request.getfixturevalue(strategy)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "terminate called" not in launched.stderr
    finished = [json.loads(line) for line in launched.stdout.splitlines() if line.startswith("{")]
    runs = {f["run"] for f in finished}
    assert sorted((f["run"], f["rank"]) for f in finished if f["status"] == "completed") == sorted(
        (run, rank) for run in runs for rank in (0, 1)
    )
    assert strategy in runs


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_b3_b4_two_ranks_x_accumulation_4_match_one_rank_x_accumulation_8(
    request, reference, strategy
):
    request.getfixturevalue(strategy)
    out = reference["out"]
    single, replicas = _curve(out / "single"), _curve(out / strategy)
    gap = _relative_gap(replicas, single)
    norms = _relative_gap(_curve(out / strategy, "grad_norm"), _curve(out / "single", "grad_norm"))
    print(f"\n{strategy}: max relative gap vs 1 process: loss {gap:.2e}, grad norm {norms:.2e}")
    assert len(replicas) == len(single) == 6
    torch.testing.assert_close(replicas, single, rtol=RTOL, atol=0)
    torch.testing.assert_close(
        _curve(out / strategy, "grad_norm"), _curve(out / "single", "grad_norm"), rtol=1e-4, atol=0
    )
    # S7: the whole update's examples, counted across ranks, partial updates included.
    assert _curve(out / strategy, "examples") == _curve(out / "single", "examples") == [16, 2] * 3


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_b3_b4_rank0_alone_writes_one_line_per_update_and_per_evaluation(
    request, reference, strategy
):
    request.getfixturevalue(strategy)
    folder = reference["out"] / strategy
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["update"] for x in lines] == [1, 2, 3, 4, 5, 6]
    evals = [json.loads(x) for x in (folder / "evals.jsonl").read_text().splitlines()]
    assert [e["update"] for e in evals] == [3, 6]
    single = (reference["out"] / "single" / "evals.jsonl").read_text().splitlines()
    # FSDP evaluates on every rank in lockstep (its forwards gather weights), DDP on rank 0;
    # greedy generation through either gives the 1-process tokens.
    assert [e["eval"]["generated"] for e in evals] == [
        json.loads(x)["eval"]["generated"] for x in single
    ]
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == [
        "step-000003", "step-000006"
    ]  # fmt: skip


def test_s4_s5_every_rank_of_a_ddp_run_records_its_memory_per_phase_with_the_same_bounds(
    reference, ddp
):
    """Each rank writes its own rows (runs/<id>/memory/rank-K.jsonl): loading and wrapping,
    the first update (optimizer state), a steady update, the evaluation of its share of the
    validation set, and the checkpoint both join; every row with the same counters on the
    same kind of device."""
    from tunepilot.measure.phase_log import read_phase_rows

    assert ddp.returncode == 0, ddp.stderr[-3000:]
    rows = read_phase_rows(reference["out"] / "ddp")
    phases = {rank: [r["phase"] for r in rows if r["rank"] == rank] for rank in (0, 1)}
    assert phases[0] == ["load", "first update", "steady update", "evaluation", "checkpoint"]
    assert phases[1] == phases[0]
    assert {(r["world_size"], r["device_kind"], tuple(r["counters"])) for r in rows} == {
        (2, "cpu", ("rss",))}  # fmt: skip
    assert all(r["completed"] and r["readings"][0]["peak_bytes"] > 0 for r in rows)
    assert [r["update"] for r in rows if r["rank"] == 1] == [None, 1, 2, 3, 3]


@pytest.mark.slow
def test_b4_sharded_checkpoint_is_the_single_process_format(reference, ddp, fsdp):
    """The FSDP2 checkpoint loads in one process with the ordinary loader (weights and
    optimizer), and holds the same numbers as the DDP one, to the float32 tolerance."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tunepilot.train.checkpoint import load_checkpoint

    out = reference["out"]
    sharded = out / "fsdp" / "checkpoints" / "step-000006"
    replicated = out / "ddp" / "checkpoints" / "step-000006"
    assert sorted(p.name for p in sharded.iterdir()) == sorted(p.name for p in replicated.iterdir())
    for name in ("adapter_model.safetensors", "optimizer.safetensors"):
        a, b = load_file(str(sharded / name)), load_file(str(replicated / name))
        assert a.keys() == b.keys(), name
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)

    base = AutoModelForCausalLM.from_pretrained(reference["spec"]["model_dir"])
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    state = load_checkpoint(sharded, model, optimizer)
    assert state["update"] == 6 and state["plan"]["replicas"] == 2
    assert len(optimizer.state) == len(params)


@pytest.mark.slow
def test_r1_b4_fsdp_pause_and_resume_continues_the_identical_curve(reference, fsdp):
    out = reference["out"]
    assert _curve(out / "fsdp-resumed") == _curve(out / "fsdp")


@pytest.fixture(scope="module")
def dropout(reference: dict) -> list[subprocess.CompletedProcess]:
    """LoRA dropout 0.1, DDP and FSDP2: 6 updates, and 3 updates then a resume to 6 in a
    second torchrun launch (new processes: all they continue from is on disk)."""
    with_dropout = {**reference, "spec": {**reference["spec"], "lora_dropout": 0.1}}
    first = _launch(with_dropout, "dropout", [
        run for s in ("ddp", "fsdp")
        for run in ([f"{s}-dropout", s, None, False], [f"{s}-dropout-resumed", s, 3, False])
    ])  # fmt: skip
    if first.returncode:
        return [first]
    resumes = [[f"{s}-dropout-resumed", s, None, True] for s in ("ddp", "fsdp")]
    return [first, _launch(with_dropout, "dropout-resume", resumes)]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_r1_b3_b4_resume_with_dropout_restores_every_ranks_generators(reference, dropout, strategy):
    """With dropout every rank draws its own masks: the checkpoint holds every rank's
    generators, so the resumed curve and the final adapter are bit-identical (CPU)."""
    from safetensors.torch import load_file

    for launched in dropout:
        assert launched.returncode == 0, launched.stderr[-3000:]
    out = reference["out"]
    whole, resumed = out / f"{strategy}-dropout", out / f"{strategy}-dropout-resumed"
    assert len(_curve(whole)) == 6
    print(f"\n{strategy}, dropout 0.1: whole {_curve(whole)}\n  resumed {_curve(resumed)}")
    assert _curve(resumed) == _curve(whole)
    assert _curve(resumed, "grad_norm") == _curve(whole, "grad_norm")
    a, b = (load_file(str(r / "checkpoints" / "step-000006" / "adapter_model.safetensors"))
            for r in (whole, resumed))  # fmt: skip
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state = json.loads((resumed / "checkpoints" / "step-000003" / "state.json").read_text())
    assert sorted(state["rng_ranks"]) == ["1"]  # rank 0's stay where one process puts them
    tensors = load_file(str(resumed / "checkpoints" / "step-000003" / "rng.safetensors"))
    assert not torch.equal(tensors["torch_cpu"], tensors["rank1.torch_cpu"])


def test_r1_b3_rng_files_keep_one_process_format_and_give_each_rank_its_own():
    """World size 1 writes exactly what a single process always wrote; with replicas rank
    r > 0 is under "rank<r>." and "rng_ranks"; a checkpoint that saved rank 0's generators
    only gives ranks > 0 None (the loop then reseeds them)."""
    from tunepilot.train import rng

    rng.seed_everything(1)
    one = rng.capture()
    rng.seed_everything(2)
    two = rng.capture()
    entries, tensors = rng.to_files([one])
    assert entries == {"rng": one[0]} and tensors.keys() == one[1].keys()
    entries, tensors = rng.to_files([one, two])
    assert set(entries) == {"rng", "rng_ranks"} and "rank1.torch_cpu" in tensors
    for rank, captured in enumerate((one, two)):
        json_part, mine = rng.of_rank(entries, tensors, rank)
        assert json_part == captured[0] and mine.keys() == captured[1].keys()
        assert all(torch.equal(mine[k], captured[1][k]) for k in mine)
    old_entries, old_tensors = rng.to_files([one])
    assert rng.of_rank(old_entries, old_tensors, 1) is None


# ---------------------------------------------------------------------------------------------
# the entry points: `tunepilot run --nproc N` (jobs.run_distributed -> torchrun -> worker)
# ---------------------------------------------------------------------------------------------

SHORT = {
    "training.budget.updates": 6, "training.eval_every": 3, "training.microbatch": 2,
    "training.accumulation": 4, "training.warmup_updates": 0, "training.lr": 2e-3,
    "training.max_new_tokens": 8, "seeds": [0],
}  # fmt: skip


def test_b3_launch_is_standalone_unless_rendezvous_flags_are_passed_through():
    from tunepilot.experiments.jobs import torchrun_command

    cmd = torchrun_command("c.yaml", 2, "control", 1, ["training.lr=1e-4"], strategy="fsdp")
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    tail = cmd[cmd.index("tunepilot.experiments.worker") + 1 :]
    assert tail == ["c.yaml", "training.lr=1e-4", "--variant", "control", "--seed", "1",
                    "--strategy", "fsdp"]  # fmt: skip
    rendezvous = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv_endpoint", "host:29400"]
    multi = torchrun_command("c.yaml", 4, "control", 0, [], rendezvous)
    assert "--standalone" not in multi and "--rdzv_endpoint" in multi
    resumed = torchrun_command("c.yaml", 2, "v", 0, run_id="v-s0-1", resume=True, stop_after=3)
    assert resumed[-5:] == ["--run-id", "v-s0-1", "--resume", "--stop-after", "3"]


def test_b3_worker_outside_torchrun_says_how_to_launch_it(monkeypatch):
    from tunepilot.errors import InputError
    from tunepilot.train.distributed import init_process_group_from_env

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(InputError, match="not inside torchrun") as err:
        init_process_group_from_env()
    assert "tunepilot run --nproc" in err.value.problems[0].fix


def test_b4_unknown_strategy_is_refused_with_the_known_ones():
    from tunepilot.errors import InputError
    from tunepilot.train.distributed import DistContext, wrap_model

    with pytest.raises(InputError, match="unknown strategy") as err:
        wrap_model(torch.nn.Linear(2, 2), "zero3", DistContext(0, 1, 0, "cpu", "gloo"))
    assert "ddp, fsdp" in err.value.problems[0].fix


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny causal-LM extraction campaign (greedy generation at evaluation)."""
    from tunepilot.demo.campaign import write_demo_campaign

    folder = tmp_path_factory.mktemp("nproc-campaign")
    return write_demo_campaign(folder, "extraction", tiny=True, n_conversations=40, overrides=SHORT)


@pytest.fixture(scope="module")
def single_run(campaign: Path) -> list[float]:
    """The same campaign in one process with accumulation 8: 16 examples per update."""
    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments import flow as run_flow

    ws = Workspace.open(campaign, ["training.accumulation=8"])
    run_flow.run(ws, ["control"], "0", None, as_json=True)
    return _curve(ws.runs_dir / "control-s0-1")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_b3_b4_s7_run_nproc_2_through_the_entry_points(campaign, single_run, strategy, capfd):
    import yaml

    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments.jobs import run_distributed
    from tunepilot.ledger import Ledger

    ws = Workspace.open(campaign)
    assert run_distributed(ws, "control", 0, 2, strategy) == 0
    printed = " ".join(capfd.readouterr().out.split())
    assert f"world size 2 ({strategy}, gloo on cpu)" in printed
    assert "2 per microbatch x 4 accumulations x 2 replicas = 16 examples per update" in printed
    with Ledger.open(ws.ledger_path) as ledger:
        row = ledger.list_runs()[-1]
        assert row.status == "completed", row.reason
        assert row.budget["world_size"] == 2 and row.budget["examples_per_update"] == 16
        assert len(ledger.curve(row.id)) == 6
        assert ledger.evaluations(run_id=row.id)[-1].split == "validation"
    run_dir = ws.runs_dir / row.id
    resolved = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
    assert resolved["training"]["distributed"] == {"strategy": strategy, "nproc": 2}
    assert resolved["_run"]["world_size"] == 2 and resolved["_run"]["examples_per_update"] == 16
    replicas = _curve(run_dir)
    print(f"\n{strategy} via torchrun: max relative gap {_relative_gap(replicas, single_run):.2e}")
    torch.testing.assert_close(replicas, single_run, rtol=RTOL, atol=0)
    from tunepilot.measure.phase_log import read_phase_rows  # every rank's memory (S5)

    memory = read_phase_rows(run_dir)
    for rank in (0, 1):
        mine = {r["phase"] for r in memory if r["rank"] == rank}
        assert {"load", "first update", "steady update", "checkpoint"} <= mine, (rank, mine)
    evaluating = {r["rank"] for r in memory if r["phase"] == "evaluation"}
    assert evaluating == {0, 1}  # every rank evaluates its share of validation (V2, B3, B4)


@pytest.mark.slow
def test_r1_b4_resume_keeps_the_world_size_and_continues_the_curve(campaign):
    from tunepilot.data.workspace import Workspace
    from tunepilot.errors import InputError
    from tunepilot.experiments.jobs import resume_distributed, run_distributed
    from tunepilot.ledger import Ledger

    ws = Workspace.open(campaign)
    assert run_distributed(ws, "control", 0, 2, "fsdp") == 0
    assert run_distributed(ws, "control", 0, 2, "fsdp", stop_after=3) == 0
    with Ledger.open(ws.ledger_path) as ledger:
        reference, paused = ledger.list_runs()[-2:]
    assert paused.status == "interrupted" and len(_curve(ws.runs_dir / paused.id)) == 3
    with pytest.raises(InputError, match="another world size"):
        resume_distributed(ws, paused.id, nproc=1)
    assert resume_distributed(ws, paused.id) == 0
    assert _curve(ws.runs_dir / paused.id) == _curve(ws.runs_dir / reference.id)
