"""D3/D5 on real SNIPS rows: `data show` marks exactly the JSON answer + EOS as loss positions."""

from __future__ import annotations

import json
from itertools import islice

import pytest

from tunepilot.data.inspect import render_samples, samples_to_json
from tunepilot.tasks.example import Example
from tunepilot.tasks.generation import GenerationEncoder
from tunepilot.verdict import Verdict

TEMPLATE = "Extract the slots of this request as JSON.\nRequest: {text}\nJSON: "


@pytest.mark.realdata
def test_d5_snips_loss_positions_are_exactly_the_json_answer(shared_data, tmp_path):
    from tunepilot.model.tiny import train_tokenizer

    path = shared_data / "snips" / "train.jsonl"
    with path.open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in islice(fh, 40)]
    examples = [
        Example(id=r["id"], text=r["text"], source=f"{path}:{n}", target=r["slots"])
        for n, r in enumerate(rows, start=1)
    ]
    corpus = [r["text"] for r in rows] + [json.dumps(r["slots"], ensure_ascii=False) for r in rows]
    tok = train_tokenizer(tmp_path, corpus, vocab_size=600)
    enc = GenerationEncoder(tok, TEMPLATE, max_length=256)

    samples = samples_to_json(render_samples(enc, tok, examples, n=5))
    assert len(samples) == 5
    for sample, row in zip(samples, rows, strict=False):
        answer = json.dumps(row["slots"], ensure_ascii=False, separators=(",", ":"))
        assert sample["expected"] == answer
        flags = [t["loss"] for t in sample["tokens"]]
        first = flags.index(True)
        assert not any(flags[:first]) and all(flags[first:])  # one contiguous answer block
        loss_ids = [t["id"] for t in sample["tokens"] if t["loss"]]
        assert tok.decode(loss_ids) == answer + tok.eos_token
        prompt_ids = [t["id"] for t in sample["tokens"] if not t["loss"]]
        assert tok.decode(prompt_ids) == TEMPLATE.format(text=row["text"])
    # the first row has non-ASCII text in its answer ("Cita Romántica"): kept verbatim
    assert "Romántica" in samples[0]["expected"]
    from tunepilot.campaign.schema import AuditSettings
    from tunepilot.data.audit.labels import check_lengths

    lengths = check_lengths({"train": examples}, enc, "extraction", enc.max_length, AuditSettings())
    assert lengths.verdict is Verdict.PASS, lengths.sentence
