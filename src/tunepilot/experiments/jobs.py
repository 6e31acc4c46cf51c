"""Starting training processes: torchrun groups (`--nproc`) and side-by-side runs (`--jobs`).

Two ways to use several processes, for two different purposes:

* `tunepilot run --nproc N [--strategy ddp|fsdp]` (B3, B4, S7): ONE run whose updates are
  split over N data replicas. torchrun starts N copies of `tunepilot.experiments.worker`; the
  examples per update become microbatch x accumulation x N, printed and recorded.
* `tunepilot run --jobs N` (V1-V6): N *independent* runs (variant x seed) at once, each an
  ordinary `tunepilot run` child process: one per GPU (CUDA_VISIBLE_DEVICES) on a multi-GPU
  machine, or N processes on CPU with the cores divided between them (OMP_NUM_THREADS), so
  two jobs on two cores do not fight over them. The ledger takes concurrent writers (WAL).

Bit-identity of a job with the same run made alone: a run's numbers depend on its seed, data
and settings, and on CPU also on the torch thread count for large reductions (measured: a
4096 x 384 float32 `sum()` differs by 2.4e-4 between 1 and 2 threads, while matmuls,
layer_norm and softmax of that size, and every loss and gradient norm of the tiny test
models, were identical). So each job's thread count is printed and written in its log: run
it alone with the same OMP_NUM_THREADS to reproduce it bit for bit. On GPUs a job gets the
whole device, as it would alone.

Nothing here imports torch (the CLI stays light); the children do the training.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tunepilot.campaign import Campaign
from tunepilot.campaign.variants import parse_seeds, variant_names
from tunepilot.data.workspace import Workspace
from tunepilot.errors import input_error, reading
from tunepilot.train.distributed import STRATEGIES

_RENDEZVOUS_FLAGS = ("--nnodes", "--rdzv", "--master", "--node", "--standalone")
_POLL_S = 0.2


# ---------------------------------------------------------------------------------------------
# --jobs: independent runs side by side
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """Where one job runs: a name for the console and what its environment adds."""

    name: str
    env: dict[str, str]


def job_slots(jobs: int, n_runs: int, cpus: int, gpus: Sequence[str]) -> list[Slot]:
    """One slot per GPU (at most `jobs`), else `jobs` CPU slots sharing the cores.

    Pure: the caller says what the machine has. No more slots than runs, so a single run
    keeps every core, as it would alone.
    """
    if jobs < 1:
        raise input_error("--jobs", str(jobs), "use a whole number >= 1")
    if gpus:
        n = min(jobs, len(gpus), n_runs)
        threads = str(max(1, cpus // n))
        return [
            Slot(f"GPU {gpu}", {"CUDA_VISIBLE_DEVICES": gpu, "OMP_NUM_THREADS": threads})
            for gpu in gpus[:n]
        ]
    n = max(1, min(jobs, n_runs))
    threads = str(max(1, cpus // n))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "CUDA_VISIBLE_DEVICES": ""}
    return [Slot(f"CPU slot {i} ({threads} threads)", dict(env)) for i in range(n)]


def visible_gpus() -> list[str]:
    """The GPU ids a child may be given: CUDA_VISIBLE_DEVICES when set, else torch's count
    (asked only when a GPU driver is present, so a CPU machine never imports torch here)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if not (Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists()):
        return []
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


@dataclass
class _Job:
    variant: str
    seed: int
    slot: Slot
    log: Path
    process: subprocess.Popen[bytes]
    handle: IO[bytes]
    started: float


def run_jobs(
    ws: Workspace,
    variants: list[str] | None,
    seeds: str | Sequence[int] | None,
    jobs: int,
    *,
    stop_after: int | None = None,
) -> int:
    """`tunepilot run --jobs N`: every variant x seed as its own `tunepilot run` child, at most
    N at a time. Returns 0 when every child exited 0, 2 when all failed on bad input, else 1.
    """
    from tunepilot.console import console
    from tunepilot.ledger import Ledger

    names = variants or variant_names(ws.campaign)
    unknown = [v for v in names if v not in variant_names(ws.campaign)]
    if unknown:
        raise input_error("--variant", f"unknown variant(s) {', '.join(unknown)}",
                          f"use one of {', '.join(variant_names(ws.campaign))}")  # fmt: skip
    seed_list = parse_seeds(seeds, ws.campaign.seeds) if isinstance(seeds, str | None) else seeds
    pending = [(name, int(seed)) for name in names for seed in seed_list]
    slots = job_slots(jobs, len(pending), len(os.sched_getaffinity(0)), visible_gpus())
    ws.prepare()  # the split files are written once here, not raced by the children
    with Ledger.open(ws.ledger_path) as ledger:
        before = {r.id for r in ledger.list_runs()}
    logs = ws.root / "logs" / time.strftime("jobs-%Y%m%d-%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    where = ", ".join(s.name for s in slots)
    console.print(f"{len(pending)} runs, {len(slots)} at a time: {where}; logs in {logs}",
                  highlight=False)  # fmt: skip

    free, running, codes = list(slots), [], []
    try:
        while pending or running:
            while pending and free:
                variant, seed = pending.pop(0)
                running.append(_start_job(ws, variant, seed, free.pop(0), logs, stop_after))
                console.print(f"  started {variant} seed {seed} on {running[-1].slot.name}")
            time.sleep(_POLL_S)
            for job in [j for j in running if j.process.poll() is not None]:
                running.remove(job)
                free.append(job.slot)
                codes.append(_finish_job(job, console))
    finally:
        for job in running:  # interrupted (Ctrl-C, an error here): stop what we started
            job.process.terminate()
            job.process.wait(timeout=60)
            job.handle.close()

    with Ledger.open(ws.ledger_path) as ledger:
        new = [r for r in ledger.list_runs() if r.id not in before]
    for r in new:
        console.print(f"{r.id}: {r.status} ({r.reason})", highlight=False, markup=False)
    failed = [c for c in codes if c != 0]
    if not failed:
        return 0
    return 2 if all(c == 2 for c in failed) and len(failed) == len(codes) else 1


def job_command(ws: Workspace, variant: str, seed: int, stop_after: int | None) -> list[str]:
    """The child: an ordinary single-run `tunepilot run` on the same campaign + overrides."""
    cmd = [sys.executable, "-m", "tunepilot.cli", "run", str(ws.campaign_file), *ws.overrides]
    cmd += ["--variant", variant, "--seeds", str(seed)]
    return cmd + (["--stop-after", str(stop_after)] if stop_after is not None else [])


def _start_job(
    ws: Workspace, variant: str, seed: int, slot: Slot, logs: Path, stop_after: int | None
) -> _Job:
    log = logs / f"{variant}-s{seed}.log"
    handle = log.open("wb")
    cmd = job_command(ws, variant, seed, stop_after)
    header = f"# {' '.join(cmd)}\n# environment: {slot.env}\n"
    handle.write(header.encode("utf-8"))
    handle.flush()
    env = {**os.environ, **slot.env}
    process = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
    return _Job(variant, seed, slot, log, process, handle, time.monotonic())


def _finish_job(job: _Job, console: Any) -> int:
    job.handle.close()
    code = job.process.returncode
    seconds = time.monotonic() - job.started
    console.print(f"  {job.variant} seed {job.seed}: exit {code} after {seconds:.1f} s "
                  f"({job.log})", highlight=False)  # fmt: skip
    if code != 0:
        tail = job.log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        console.print("\n".join(f"    {line}" for line in tail), highlight=False, markup=False)
    return code if code >= 0 else 1  # killed by a signal: a failure


# ---------------------------------------------------------------------------------------------
# --nproc: one run over N data replicas (torchrun)
# ---------------------------------------------------------------------------------------------


def torchrun_command(
    campaign_path: Path | str,
    nproc: int,
    variant: str,
    seed: int,
    overrides: Sequence[str] = (),
    extra_torchrun_args: Sequence[str] = (),
    *,
    strategy: str = "ddp",
    run_id: str | None = None,
    resume: bool = False,
    stop_after: int | None = None,
) -> list[str]:
    """The command line `launch_torchrun` runs. `--standalone` (a free local port, so two
    launches on one machine never collide) unless rendezvous flags are passed through."""
    cmd = torchrun_prefix(nproc, extra_torchrun_args)
    cmd += ["-m", "tunepilot.experiments.worker", str(campaign_path), *overrides]
    cmd += ["--variant", variant, "--seed", str(seed), "--strategy", strategy]
    cmd += ["--run-id", run_id] if run_id else []
    cmd += ["--resume"] if resume else []
    cmd += ["--stop-after", str(stop_after)] if stop_after is not None else []
    return cmd


def torchrun_prefix(nproc: int, extra_torchrun_args: Sequence[str] = ()) -> list[str]:
    """`python -m torch.distributed.run [--standalone] --nproc_per_node N [flags]`, the start
    of every torchrun launch; `--standalone` unless rendezvous flags are passed through."""
    rendezvous = any(a.replace("_", "-").startswith(_RENDEZVOUS_FLAGS) for a in extra_torchrun_args)
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    cmd += [] if rendezvous else ["--standalone"]
    return cmd + ["--nproc_per_node", str(nproc), *extra_torchrun_args]


def torchrun_env(nproc: int) -> dict[str, str]:
    """The environment of a launch: on CPU each rank gets cores / nproc torch threads unless
    OMP_NUM_THREADS is set (torchrun alone would give every rank 1)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // nproc)))
    return env


def launch_torchrun(cmd: Sequence[str], nproc: int) -> int:
    """Run torchrun in the foreground (its output is the ranks' output); its exit code."""
    return subprocess.run(list(cmd), env=torchrun_env(nproc), check=False).returncode


def run_distributed(
    ws: Workspace,
    variant: str,
    seed: int,
    nproc: int | None = None,
    strategy: str | None = None,
    *,
    torchrun_args: Sequence[str] = (),
    stop_after: int | None = None,
) -> int:
    """`tunepilot run --nproc N [--strategy ddp|fsdp]` for one variant x seed; exit code.

    Defaults come from `training.distributed` (strategy "none" means ddp here). Bad input is
    refused here, before any process starts; a run whose ranks crashed is marked failed.
    """
    from tunepilot.experiments.worker import distributed_campaign
    from tunepilot.ledger import Ledger

    nproc, strategy = _choose(ws, nproc, strategy)
    if variant not in variant_names(ws.campaign):
        raise input_error("--variant", f"unknown variant {variant}",
                          f"use one of {', '.join(variant_names(ws.campaign))}")  # fmt: skip
    campaign = distributed_campaign(ws, variant, seed, strategy, nproc)
    _prepare(ws, campaign)
    with Ledger.open(ws.ledger_path) as ledger:
        run_id = ledger.new_run_id(variant, seed)
    cmd = torchrun_command(
        ws.campaign_file, nproc, variant, seed, ws.overrides, torchrun_args,
        strategy=strategy, run_id=run_id, stop_after=stop_after,
    )  # fmt: skip
    code = launch_torchrun(cmd, nproc)
    return _settle(ws, run_id, code)


def resume_distributed(
    ws: Workspace,
    run_id: str,
    nproc: int | None = None,
    *,
    torchrun_args: Sequence[str] = (),
    stop_after: int | None = None,
) -> int:
    """`tunepilot resume RUN` for a run that trained with replicas: same strategy and world
    size as recorded; another world size is refused (another experiment, S7)."""
    from tunepilot.ledger import Ledger

    with Ledger.open(ws.ledger_path) as ledger:
        row = ledger.get_run(run_id)
        run_dir = ledger.run_folder(row)
    recorded = distributed_settings_of(run_dir)
    if recorded is None:
        raise input_error(f"run {run_id}", "trained in a single process",
                          f"resume it with `tunepilot resume {run_id}` (no --nproc)")  # fmt: skip
    strategy, world = recorded
    if nproc is not None and nproc != world and not torchrun_args:
        raise input_error(
            "--nproc", f"{nproc}, but run {run_id} trained with {world} processes ({strategy})",
            f"resume with --nproc {world}: another world size splits every update differently "
            "and is another experiment (S7); start a new run from its weights instead",
            title="cannot resume on another world size",
        )  # fmt: skip
    cmd = torchrun_command(
        ws.campaign_file, world, row.variant, row.seed, ws.overrides, torchrun_args,
        strategy=strategy, run_id=run_id, resume=True, stop_after=stop_after,
    )  # fmt: skip
    code = launch_torchrun(cmd, world)
    return _settle(ws, run_id, code)


def distributed_settings_of(run_dir: Path) -> tuple[str, int] | None:
    """(strategy, world size) a run trained with, from its config.resolved.yaml; None when
    it ran in a single process (or has no such file)."""
    import yaml

    path = Path(run_dir) / "config.resolved.yaml"
    if not path.is_file():
        return None
    fix = ("restore it from a backup or a copy of the campaign folder (it is written once, when "
           "the run starts), or start the run again under a new id (`tunepilot run CAMPAIGN "
           f"--retry {Path(run_dir).name}`)")  # fmt: skip
    with reading(path, fix, what="resolved config", title="run files refused",
                 also=(yaml.YAMLError,)):
        resolved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        dist = (resolved.get("training") or {}).get("distributed") or {}
        if dist.get("strategy") in (None, "none"):
            return None
        return str(dist["strategy"]), int(dist.get("nproc", 1))


def _choose(ws: Workspace, nproc: int | None, strategy: str | None) -> tuple[int, str]:
    configured = ws.campaign.training.distributed
    nproc = configured.nproc if nproc is None else nproc
    strategy = strategy or (configured.strategy if configured.strategy != "none" else "ddp")
    if nproc < 1:
        raise input_error("--nproc", str(nproc), "use a whole number >= 1")
    if strategy not in STRATEGIES:
        raise input_error("--strategy", repr(strategy), f"use one of {', '.join(STRATEGIES)}")
    return nproc, strategy


def _prepare(ws: Workspace, campaign: Campaign) -> None:
    """Write the split files once, before the ranks read them; data errors stop here."""
    from tunepilot.data.prepare import prepare_data

    if campaign.data == ws.campaign.data:
        ws.prepare()
    else:
        prepare_data(campaign, ws.root, write=True)


def _settle(ws: Workspace, run_id: str, code: int) -> int:
    """After torchrun: a run left `running`/`planned` by crashed ranks is marked failed."""
    from tunepilot.console import console
    from tunepilot.experiments.runner import outcome_code
    from tunepilot.ledger import Ledger

    with Ledger.open(ws.ledger_path) as ledger:
        row = next((r for r in ledger.list_runs() if r.id == run_id), None)
        if row is not None and code != 0 and row.status in ("running", "planned"):
            ledger.set_status(run_id, "failed", f"torchrun exited with code {code}; the ranks' "
                              "output above says why")  # fmt: skip
            row = ledger.get_run(run_id)
    if row is None:
        console.print(f"{run_id}: nothing recorded (torchrun exited with code {code})")
    else:
        console.print(f"{run_id}: {row.status} ({row.reason})", highlight=False, markup=False)
    return 1 if code != 0 else outcome_code([row.status] if row else [])
