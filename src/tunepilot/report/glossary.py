"""The requirement ids the dossier cites (H3, V5, L5 ...), each in a few words, and the links.

A reader months later meets "V3" in a table and needs to know what it promises without the
specification at hand: every id in the page's text links to its line in the glossary at the
end of the dossier, which lists only the ids the page uses.
"""

from __future__ import annotations

import re

GLOSSARY = {
    "H1": "the campaign states the behaviour to improve",
    "H2": "what must not degrade: per-class metrics, JSON validity, required fields",
    "H3": "the starting model is evaluated first; its per-example predictions are kept",
    "H4": "the test split is sealed; every look is counted",
    "D1": "data, cleaning and transformations are versioned by content hash",
    "D2": "duplicates between training and evaluation are searched, exact and near",
    "D3": "a sample is shown after the exact preprocessing, loss positions included",
    "D4": "representative examples per category, for a person to check",
    "D5": "the prompt carries no loss, only the answer does (loss mask)",
    "D6": "label ids and class names are checked against each other",
    "D7": "a tiny subset is learned to check the mechanics",
    "D8": "splits are separated by the unit that prevents leakage",
    "D9": "one complete pass through training and evaluation, as a wiring check",
    "P1": "full fine-tuning or LoRA; the base's precision is part of the configuration",
    "P2": "target modules, trainable counts and saved extra layers are recorded",
    "P3": "an update changes exactly the expected parameters",
    "P4": "the adapter stays tied to its base model's exact version",
    "S1": "a whole step (loss, backward, optimizer) is sized, not only loading",
    "S2": "accumulation and its loss normalisation are documented",
    "S3": "activation checkpointing and mixed precision are checked one at a time",
    "S4": "a gate per phase: every operation of the campaign runs once",
    "S5": "one row per phase: inputs, memory counter, duration, verdict",
    "S6": "an out-of-memory names the phase and the input",
    "S7": "examples per update = microbatch x accumulation x replicas",
    "B1": "model and method are checked on the chosen backend",
    "B2": "the versions really used are recorded",
    "B3": "DistributedDataParallel: replicas, synchronised gradients, data sharding",
    "B4": "sharded state (FSDP) to fit a larger model",
    "V1": "every experiment has an id and changes one explainable set of settings",
    "V2": "one evaluation procedure for all variants; seed, budget and data recorded",
    "V3": "interrupted, diverged and failed runs keep their line",
    "V4": "the plan: control, variants, budget and stop causes fixed before the trial",
    "V5": "the loss curve, validation points and predictions are kept",
    "V6": "several seeds when differences are small, none dropped",
    "V7": "keeping the control is a valid conclusion",
    "R1": "resume restores optimizer, scheduler, step and data position",
    "R2": "the delivered artefact is reloaded and control inputs replayed",
    "R3": "model, configuration, revisions, metrics and instructions are archived",
    "R4": "only files of known provenance, in safe formats, are loaded",
    "L1": "a selection sheet: memory, dimensions, precision, batch, strategy",
    "L2": "a configuration is retained only after its software stack is checked",
    "L3": "a 3-, 7- or 30-day plan around distinct phases",
    "L4": "a notebook keeps decisions; backups keep the files",
    "L5": "the delivery: model, configuration, results and observed limits",
}

# An id, not a card name such as the L4 GPU ("L4: PASS", "L4 24GB"): nothing word-like
# before it, no colon or number after it.
_ID = re.compile(r"(?<![\w.])([HDPSBVRL][1-9])(?![\w:]|\s\d)")
_SKIP = ("a", "code", "svg", "title", "style", "head", "th")
_TAG = re.compile(r"(<[^>]+>)")


def link_ids(html: str) -> tuple[str, list[str]]:
    """Every known id in the text of `html` linked to `#req-<id>`; returns (html, ids used).

    Only text between tags changes; attributes and the text of links, code, headers of
    tables and SVG charts are left as they are.
    """
    used: list[str] = []
    depth: dict[str, int] = dict.fromkeys(_SKIP, 0)
    out = []

    def link(match: re.Match[str]) -> str:
        rid = match.group(1)
        if rid not in GLOSSARY:
            return rid
        if rid not in used:
            used.append(rid)
        return f'<a class="req" href="#req-{rid}" title="{GLOSSARY[rid]}">{rid}</a>'

    for piece in _TAG.split(html):
        if piece.startswith("<"):
            name = re.match(r"</?([a-zA-Z0-9]+)", piece)
            tag = name.group(1).lower() if name else ""
            if tag in depth and not piece.endswith("/>"):
                depth[tag] += -1 if piece.startswith("</") else 1
            out.append(piece)
        elif any(depth.values()):
            out.append(piece)
        else:
            out.append(_ID.sub(link, piece))
    return "".join(out), used


def glossary_section(used: list[str]) -> str:
    """The ids this dossier cites, in the specification's order, each with its anchor."""
    ids = [rid for rid in GLOSSARY if rid in used]
    if not ids:
        return "<p>This dossier cites no requirement id.</p>"
    items = "".join(f'<dt id="req-{rid}">{rid}</dt><dd>{GLOSSARY[rid]}</dd>' for rid in ids)
    return ("<p>The requirement ids cited above, each in a few words (the tunepilot "
            f'specification states them in full).</p><dl class="kv glossary">{items}</dl>')
