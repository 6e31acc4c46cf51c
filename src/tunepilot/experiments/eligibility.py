"""Which evaluations may be set next to the control's (V2, S6): the eligibility rule of compare.

Kept apart from the statistics because it is a rule about *what* is compared, not *how*: the
same evaluation procedure and the same examples are required; another encoding of those
examples (max_length, template, tokenizer) is a variant like any other, unless it cut the
expected answers. Before that, what may be pooled at all (`exclude_unpoolable`): the seeds of
a variant are the runs that trained as the campaign says the variant trains (V1, V2), on the
backend the control ran on (B1).
"""

from __future__ import annotations

from typing import Any, Protocol

from tunepilot.data.version import version_parts


class Reference(Protocol):
    """The control run every other evaluation is compared with."""

    run_id: str
    eval_config_hash: str | None
    data_version: str | None
    metrics: dict[str, Any]


def incomparable(eval_hash: str | None, data_version: str | None, ref: Reference,
                 metrics: dict[str, Any] | None = None) -> str | None:  # fmt: skip
    """Why an evaluation cannot be set next to the reference's (V2, S6), or None.

    Same evaluation procedure and same examples are required. Another encoding of the same
    examples (a max_length, template or tokenizer variant) is compared, unless it cut the
    answers of more examples than the reference's encoding did: a fit bought by cutting the
    expected output is not the same experiment (S6)."""
    if eval_hash != ref.eval_config_hash:
        return (
            f"evaluated with eval config {eval_hash} but the control ({ref.run_id}) with "
            f"{ref.eval_config_hash}: another split, batch, decoding or metric set, so the "
            "numbers do not mean the same thing (V2); run it again under this campaign"
        )
    examples, encoding = version_parts(data_version)
    ref_examples, ref_encoding = version_parts(ref.data_version)
    if examples != ref_examples:
        return (
            f"data version {data_version} but the control ({ref.run_id}) used "
            f"{ref.data_version}: other examples (D1, V2); run it again on this data"
        )
    if encoding == ref_encoding:
        return None
    cut, ref_cut = _answers_cut(metrics), _answers_cut(ref.metrics)
    if cut is None or ref_cut is None:
        return (
            f"encoded differently from the control ({data_version} vs {ref.data_version}) and "
            "its evaluation does not record whether max_length cut answers; run it again"
        )
    if cut > ref_cut:
        return (
            f"its encoding ({data_version}: another max_length, template or tokenizer than the "
            f"control's {ref.data_version}) cuts the answers of {cut} training/validation "
            f"examples where the control's cuts {ref_cut}: a fit bought by cutting the expected "
            "output is not the same experiment (S6); raise data.max_length for it"
        )
    return None


def _answers_cut(metrics: dict[str, Any] | None) -> int | None:
    """Training + evaluated examples whose answer tokens the encoding cut, if recorded."""
    values = [(metrics or {}).get(k) for k in ("answers_cut", "train_answers_cut")]
    if not all(isinstance(v, int | float) for v in values):
        return None
    return round(sum(values))  # type: ignore[arg-type]


# Parts of a resolved campaign that do not change what a run computes: the run's own identity
# (its seed, recorded apart), the other variants, the guards (judged at compare time, changed
# only by a recorded amendment), where the data file lives (its content is the data version)
# the audit's thresholds and bookkeeping (trackers, rental, checkpoint cadence).
LEFT_OUT = (
    ("_run",), ("tracking",), ("variants",), ("seeds",), ("rental",), ("test_policy",),
    ("hypothesis",), ("card",), ("data", "file"), ("data", "files"), ("data", "audit"),
    ("data", "images", "size_leak_accuracy"), ("data", "images", "near_duplicate_bits"),
    ("data", "images", "near_duplicate_pixel_diff"), ("training", "seed"),
    ("training", "keep_last_checkpoints"), ("training", "checkpoint_every"),
)  # fmt: skip


def trained_settings(resolved: dict[str, Any]) -> dict[str, Any]:
    """A resolved campaign (config.resolved.yaml, or a variant's model_dump) without the parts
    in LEFT_OUT: what two runs of one variant must share to be seeds of one experiment."""
    import copy

    out = copy.deepcopy(resolved)
    for path in LEFT_OUT:
        node = out
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


def settings_key(resolved: dict[str, Any]) -> str:
    """The short hash of `trained_settings`: seeds of one experiment share it."""
    from tunepilot.campaign import stable_hash

    return stable_hash(trained_settings(resolved))


def read_resolved(folder: Any) -> dict[str, Any] | None:
    """A run's config.resolved.yaml, None when absent or unreadable (safe YAML only)."""
    from pathlib import Path

    import yaml

    try:
        value = yaml.safe_load((Path(folder) / "config.resolved.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return value if isinstance(value, dict) else None


def other_settings(run: dict[str, Any], expected: dict[str, Any], variant: str) -> str | None:
    """Why a run cannot be pooled with the other seeds of `variant` (V1, V2), or None: the
    settings it trained with differ from what the campaign says that variant is. A setting
    only one side has (written by another tunepilot version, which had no such key) is not
    a difference: it ran with that version's default."""
    from tunepilot.campaign.loading import leaf_settings

    mine, theirs = (
        {".".join(k): v for k, v in leaf_settings(trained_settings(side)).items()}
        for side in (run, expected)
    )
    differ = [k for k in sorted(set(mine) & set(theirs)) if mine[k] != theirs[k]]
    if not differ:
        return None
    shown = ", ".join(f"{k} {mine.get(k)!r} where the campaign's `{variant}` has "
                      f"{theirs.get(k)!r}" for k in differ[:3])  # fmt: skip
    more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
    return (f"trained with other settings than `{variant}` ({shown}{more}; config "
            f"{settings_key(run)} vs {settings_key(expected)}): another experiment under the "
            "same name is never pooled with its seeds (V1, V2); give it its own variant, or run "
            "it again as the campaign says")  # fmt: skip


def as_the_run_resolved(configured: Any, env: dict[str, Any] | None) -> dict[str, Any]:
    """The variant's settings with what it leaves to the machine resolved for the device type
    the run recorded (env.json's runtime), as the runner resolved them when it started: a
    run may differ from its variant by what it was told, never by what the tool chose."""
    from tunepilot.train.runtime import on_this_machine

    device_type = ((env or {}).get("runtime") or {}).get("device_type") or "cpu"
    training = on_this_machine(configured.training, str(device_type))
    return configured.model_copy(update={"training": training}).model_dump(mode="json")


def exclude_unpoolable(variants: list[Any], campaign: Any, ledger: Any) -> list[str]:
    """The pooling rule (V1, V2, B1), before any number is drawn: a run trained with other
    settings than its variant has in the campaign (a command-line override, an edited file)
    is listed apart with the difference, never counted as one more seed; and runs are
    compared within one backend, the one the latest pooled control run used (another kernel
    library or card is another measurement). Returns notes on what could not be checked."""
    from tunepilot.campaign.variants import variant_campaign
    from tunepilot.errors import InputError
    from tunepilot.measure.env import backend_of, read_env

    unknown = []
    for v in variants:
        for x in v.runs:
            x.backend = backend_of(read_env(ledger.run_folder(x.run_id)))
        try:
            configured = variant_campaign(campaign, v.name)
        except InputError:
            configured = None  # a variant no longer in the campaign: nothing to hold it to
        for x in v.used:
            folder = ledger.run_folder(x.run_id)
            resolved = read_resolved(folder)
            if resolved is None:
                unknown.append(x.run_id)
            elif configured is not None:
                expected = as_the_run_resolved(configured, read_env(folder))
                if why := other_settings(resolved, expected, v.name):
                    x.excluded = f"not pooled: {why}"
    reference = [x for x in variants[0].used if x.backend is not None] if variants else []
    if reference:
        ref = max(reference, key=lambda x: x.evaluation_id or 0)
        for v in variants:
            for x in v.used:
                if x.backend is not None and x.backend != ref.backend:
                    x.excluded = (
                        f"not compared: ran on {x.backend} but the control ({ref.run_id}) on "
                        f"{ref.backend}: runs on different backends are not one measurement "
                        f"(B1); run it again on {ref.backend}, or run the control on "
                        f"{x.backend} too and compare those")  # fmt: skip
    missing = sorted(set(unknown) | {x.run_id for v in variants for x in v.used
                                     if x.backend is None})  # fmt: skip
    if not missing:
        return []
    return [f"{len(missing)} run(s) have no recorded settings or backend (config.resolved.yaml, "
            f"env.json: {', '.join(missing[:5])}): pooled without checking that they trained "
            "as their variant says, on one backend"]  # fmt: skip
