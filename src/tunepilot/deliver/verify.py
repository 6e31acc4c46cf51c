"""`tunepilot verify DIR`: prove a delivered bundle reloads and answers as it did (R2-R4).

The check itself lives in `tunepilot.deliver.bundle_check`, which this module starts in a *new*
Python process: the parent's memory (a model that trained, a tokenizer already patched, a
module already imported) must not be able to make a broken bundle pass. The child is started
with `-P` so neither the working folder nor the bundle folder can shadow a module it imports,
and always with `HF_HUB_OFFLINE=1`: verify checks the bundle against a base already on this
machine, so a missing base fails in seconds instead of reaching for the network.

The other half of the check is `controls.py`: what the model *in memory* answered to a few
validation inputs before export wrote anything. The child must reproduce it from the files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tunepilot.errors import InputError, input_error
from tunepilot.train.manifest import manifest_digest
from tunepilot.verdict import Finding, Verdict

CHECK_MODULE = "tunepilot.deliver.bundle_check"
CHILD_TUNEPILOT_MODULES = {"tunepilot", "tunepilot.deliver", CHECK_MODULE}
"""The only tunepilot modules the child may import: the package roots (a version string, a
docstring) and the checker, which uses the standard library, transformers, peft, safetensors
and torch."""
DEFAULT_TIMEOUT_S = 900.0


def run_bundle_check(
    bundle_dir: Path, base: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """Run the checker in a fresh interpreter; returns its JSON payload plus `returncode`."""
    cmd = [sys.executable, "-P", "-m", CHECK_MODULE, str(bundle_dir)]
    if base is not None:
        cmd += ["--base", str(base)]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
    )
    try:
        payload = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        payload = {}
    payload["returncode"] = done.returncode
    payload["stderr_tail"] = done.stderr[-2000:]
    return payload


def verify_bundle(
    bundle_dir: Path, base: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[Finding]:
    """R2, R4: every hash, every file type, the base (P4), then reload and replay, in a new
    process. Returns findings; a FAIL names the file or the control input that differs."""
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise input_error(
            str(bundle_dir),
            "no such bundle folder",
            "give the folder written by `tunepilot export`",
        )
    payload = run_bundle_check(bundle_dir.resolve(), base, timeout_s)
    if payload["returncode"] != 0 or "findings" not in payload:
        tail = payload["stderr_tail"].strip().splitlines()[-3:]
        return [
            Finding(
                "reload process",
                Verdict.FAIL,
                f"the check process (`python -m "
                f"{CHECK_MODULE}`) exited {payload['returncode']} without a result: "
                f"{' | '.join(tail)}",
                "R2",
            )
        ]
    findings = [
        Finding(
            f["check"],
            Verdict(f["verdict"]),
            f["sentence"],
            f["requirement"],
            list(f.get("examples") or []),
            dict(f.get("details") or {}),
        )
        for f in payload["findings"]
    ]
    loaded = sorted(payload.get("tunepilot_modules") or [])
    extra = sorted(set(loaded) - CHILD_TUNEPILOT_MODULES)
    if extra:
        findings.append(
            Finding(
                "isolation",
                Verdict.FAIL,
                f"the check process imported "
                f"tunepilot code beyond the checker ({', '.join(extra[:5])}): a "
                "PASS would not prove plain transformers + peft can load it",
                "R2",
                extra,
            )
        )
    else:
        findings.append(
            Finding(
                "isolation",
                Verdict.PASS,
                f"checked in a new process (pid "
                f"{payload.get('pid')}, {payload.get('seconds')} s) whose only "
                f"tunepilot modules were {', '.join(loaded)}",
                "R2",
                details={"tunepilot_modules": loaded, "stack": payload.get("stack") or {}},
            )
        )
    return findings


def expect_finding(bundle_dir: Path, expected: str) -> Finding:
    """PASS when the bundle's MANIFEST digest is the one pinned; FAIL naming both if not."""
    path = Path(bundle_dir) / "MANIFEST.json"
    if not path.is_file():
        return Finding("pinned digest", Verdict.FAIL, f"{path} is missing", "R3, R4")
    found, want = manifest_digest(bundle_dir), expected.strip().lower()
    if found == want:
        return Finding("pinned digest", Verdict.PASS, f"MANIFEST.json sha256 {found} is the one "
                       "pinned: with every file checked against it, this is the exported bundle",
                       "R3, R4")  # fmt: skip
    return Finding("pinned digest", Verdict.FAIL, f"MANIFEST.json sha256 is {found}, not the "
                   f"pinned {want}: the bundle (or its MANIFEST) was changed or replaced after "
                   "export; use the bundle that was exported, or export the run again", "R3, R4")


def verification_path(bundle_dir: Path) -> Path:
    """Where the last reload check of a bundle is kept (read by the dossier, L5)."""
    bundle_dir = Path(bundle_dir).resolve()
    return bundle_dir.parent / f"{bundle_dir.name}.verification.json"


def record_verification(bundle_dir: Path, payload: dict[str, Any]) -> None:
    import datetime

    from tunepilot.errors import write_json_atomic

    stamped = {**payload, "at": datetime.datetime.now(datetime.UTC).isoformat()}
    write_json_atomic(verification_path(bundle_dir), stamped)


def verify_command(
    bundle_dir: Path, as_json: bool, base: Path | None = None, expect: str | None = None
) -> int:
    """Body of `tunepilot verify DIR [--base FOLDER] [--expect SHA] [--json]`; exit 1 on any
    FAIL. `expect` pins the bundle: the sha256 of MANIFEST.json printed at export."""
    from tunepilot.console import print_findings, print_json
    from tunepilot.train.manifest import parse_pin
    from tunepilot.verdict import exit_code, worst

    if expect is not None:
        expect = parse_pin(expect, "paste the pin `tunepilot export` printed (also in the "
                           "ledger and the report)")  # fmt: skip
    findings = verify_bundle(bundle_dir, base)
    if expect is not None:
        findings.insert(0, expect_finding(Path(bundle_dir), expect))
    payload = {
        "bundle": str(Path(bundle_dir).resolve()),
        "manifest_sha256": manifest_digest(bundle_dir) if Path(bundle_dir, "MANIFEST.json")
        .is_file() else None,
        "verdict": str(worst(findings)),
        "findings": [f.to_json() for f in findings],
    }
    # Beside the bundle, never inside it: the bundle's manifest lists exactly what it holds.
    # A bundle on a read-only medium is still verified: only the record is skipped, said so.
    try:
        record_verification(Path(bundle_dir), payload)
    except InputError as err:
        from tunepilot.console import error_console

        error_console.print(f"[yellow]warning:[/] the result is not recorded for the dossier: "
                            f"{err.problems[0]}", highlight=False, soft_wrap=True)  # fmt: skip
    if as_json:
        print_json(payload)
    else:
        print_findings(findings, f"reload check of {bundle_dir} (R2, R4, P4)")
    return exit_code(findings)
