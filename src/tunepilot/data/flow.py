"""The data commands end to end: prepare -> audit / show, with the result saved next to the
data version so a colleague can re-read what was checked (D1-D8)."""

from __future__ import annotations

from typing import Any

from tunepilot.data.workspace import Workspace
from tunepilot.errors import write_json_atomic
from tunepilot.verdict import Finding, exit_code


def audit_findings(ws: Workspace, with_tokenizer: bool = True) -> tuple[Any, list[Finding]]:
    """Prepare the data and run every audit check; returns (prepared, findings)."""
    from tunepilot.progress import Progress

    prepared = ws.prepare(seal=False)  # looking at data never seals the test split (H4)
    n = sum(map(len, prepared.splits.values()))
    what = f"data audit of version {prepared.version} ({n} examples)"
    with Progress(what, None, "checks", heartbeat=True):  # minutes on a large file: say so
        findings = _run_checks(ws, prepared, with_tokenizer)
    if prepared.folder is not None:
        write_json_atomic(
            prepared.folder / "audit.json",
            {
                "version": prepared.version,
                "findings": [f.to_json() for f in findings],
            },
        )
    return prepared, findings


def _run_checks(ws: Workspace, prepared: Any, with_tokenizer: bool) -> list[Finding]:
    """Every audit check of the prepared data: the image checks, or the text ones."""
    from tunepilot.data.audit.run import run_audit

    label_map = ws.model_label_map() if with_tokenizer else None
    campaign = ws.campaign
    if campaign.hypothesis.task == "image_classification":  # decodes files, no processor
        from tunepilot.data.images.audit import run_image_audit

        findings, facts = run_image_audit(prepared, campaign.data, ws.root, label_map)
        if with_tokenizer:  # the processor's own output, and the sheet the report embeds
            from tunepilot.data.images.processed import check_processed_range
            from tunepilot.data.images.show import show_images

            encoder = ws.encoder(prepared.label_names)
            usable = {s: [f.example for f in facts if f.error is None and f.split == s]
                      for s in prepared.splits}  # fmt: skip
            findings.append(check_processed_range(encoder, usable))
            if prepared.folder is not None:
                show_images(encoder, usable["train"], "train", ws.root, prepared.folder, 0, 1)
    else:
        encoder = ws.encoder(prepared.label_names) if with_tokenizer else None
        config = ws.model_config() if with_tokenizer else None
        findings = run_audit(
            prepared, campaign.data, campaign.hypothesis.task, encoder, label_map,
            hypothesis=campaign.hypothesis, model_config=config,
        )  # fmt: skip
    return findings


def audit_workspace(ws: Workspace, as_json: bool, with_tokenizer: bool = True) -> int:
    from tunepilot.console import console, print_findings, print_json

    prepared, findings = audit_findings(ws, with_tokenizer)
    if as_json:
        print_json(
            {
                "version": prepared.version,
                "counts": {k: len(v) for k, v in prepared.splits.items()},
                "findings": [f.to_json() for f in findings],
            }
        )
    else:
        counts = ", ".join(f"{k} {len(v)}" for k, v in prepared.splits.items())
        print_findings(findings, f"data audit: version {prepared.version} ({counts})")
        if prepared.folder is not None:
            console.print(f"saved {prepared.folder / 'audit.json'}")
    return exit_code(findings)


def show_workspace(ws: Workspace, split: str, n: int, per_class: int, as_json: bool) -> int:
    from tunepilot.console import console, print_json
    from tunepilot.data.inspect import print_samples, render_samples, samples_to_json
    from tunepilot.errors import input_error

    prepared = ws.prepare(seal=False)
    if split not in prepared.splits or not prepared.splits[split]:
        raise input_error(
            "--split",
            f"split `{split}` is empty or unknown",
            f"use one of {', '.join(k for k, v in prepared.splits.items() if v)}",
        )
    encoder = ws.encoder(prepared.label_names)
    if ws.campaign.hypothesis.task == "image_classification":
        from tunepilot.data.images.show import print_image_samples, samples_json, show_images

        found, sheet = show_images(encoder, prepared.splits[split], split, ws.root,
                                   prepared.folder, n, per_class)  # fmt: skip
        if as_json:
            print_json({"version": prepared.version, "split": split,
                        "samples": samples_json(found), "contact_sheet": str(sheet)})  # fmt: skip
        else:
            print_image_samples(found, sheet, console)
        return 0
    samples = render_samples(
        encoder, ws.tokenizer, prepared.splits[split], n=n, per_class=per_class
    )
    if as_json:
        print_json(
            {"version": prepared.version, "split": split, "samples": samples_to_json(samples)}
        )
    else:
        print_samples(samples, console)
    return 0


