"""Which evaluations may be set next to the control's (V2, S6): the eligibility rule of compare.

Kept apart from the statistics because it is a rule about *what* is compared, not *how*: the
same evaluation procedure and the same examples are required; another encoding of those
examples (max_length, template, tokenizer) is a variant like any other, unless it cut the
expected answers.
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
