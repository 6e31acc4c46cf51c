"""`data show --batch`: the batch as training builds it (D3, D5; seed 004: "check the slicing,
padding, masks and labels really passed to the loss").

One real microbatch: the training split encoded as a run encodes it, the first microbatch of
the first update that the loop's sampler draws (same seed, microbatch, accumulation,
bucketing), and `collate` with the campaign's padding or packing. Nothing is re-implemented
for the view: the tensors shown are the ones a run's first forward receives, row by row, with
every token decoded, its attention (the padding mask, or the example it belongs to in a packed
row), its position id, and the label passed to the loss, ignored positions marked.

The view is written to `data/<version>/batch.json` for the dossier, which reads it as data
and escapes every string (it never loads a tokenizer or a model itself).
"""

from __future__ import annotations

from typing import Any

from tunepilot.data.workspace import Workspace
from tunepilot.errors import write_json_atomic
from tunepilot.tasks.base import IGNORE_INDEX

IGNORED = "·"
"""How an ignored label (IGNORE_INDEX, no loss) is shown in the printed table."""


def batch_view(ws: Workspace) -> dict[str, Any]:
    """The first training microbatch of a run of this campaign, as JSON-ready data."""
    from tunepilot.experiments.evaluate import pad_id_of
    from tunepilot.experiments.runner import model_kind
    from tunepilot.tasks import make_encoder
    from tunepilot.train.batching import UpdateSampler, collate, count_targets
    from tunepilot.train.packing import packing_of

    c, t = ws.campaign, ws.campaign.training
    prepared = ws.prepare(seal=False)  # looking never seals the test split (H4)
    encoder = make_encoder(c, ws.tokenizer, prepared.label_names, ws.root).training_view()
    train = [encoder.encode(e) for e in prepared.splits["train"]]
    kind = model_kind(c)
    sampler = UpdateSampler([len(e.input_ids) for e in train], t.microbatch, t.accumulation,
                            seed=t.seed, drop_last=t.drop_last,
                            bucket_by_length=t.bucket_by_length)  # fmt: skip
    update = sampler.next_update()
    examples = [train[i] for i in update.microbatches[0]]
    packing = packing_of(c)
    if packing is not None and c.model.attn_implementation:
        from dataclasses import replace

        from tunepilot.train.packing import attention_named

        packing = replace(packing, attention=attention_named(c.model.attn_implementation))
    batch = collate(examples, kind, pad_id_of(ws.tokenizer), packing)  # type: ignore[arg-type]
    view: dict[str, Any] = {
        "version": prepared.version, "split": "train", "update": 1, "microbatch": 1,
        "microbatches_in_update": len(update.microbatches),
        "layout": "packed" if packing is not None else (
            "pixels" if "pixel_values" in batch else "padded"),
        "packing": packing.to_json() if packing is not None else None,
        "tensors": {k: list(v.shape) for k, v in batch.items()},
        "loss_targets": count_targets(batch, kind),  # type: ignore[arg-type]
        "examples": [e.example_id for e in examples],
    }  # fmt: skip
    view["rows"] = _rows(batch, examples, kind, ws.tokenizer, prepared.label_names, packing)
    if prepared.folder is not None:
        write_json_atomic(prepared.folder / "batch.json", view)
    return view


def _rows(batch: dict[str, Any], examples: list[Any], kind: str, tokenizer: Any,
          label_names: list[str] | None, packing: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Every row of the collated microbatch: its examples' spans and every position."""
    from tunepilot.train.packing import row_spans

    names = list(label_names or [])
    if "pixel_values" in batch:  # an image microbatch: one picture per row, one class id
        return [{"examples": [{"id": e.example_id, "start": 0, "end": 0}],
                 "pixels": list(batch["pixel_values"][r].shape),
                 "class": _class(int(batch["labels"][r]), names)}
                for r, e in enumerate(examples)]  # fmt: skip
    if packing is not None:
        spans = row_spans(examples, packing)
    else:
        spans = [[(r, 0, len(e.input_ids))] for r, e in enumerate(examples)]
    out = []
    for r, row in enumerate(spans):
        ids = batch["input_ids"][r].tolist()
        owner: list[int | None] = [None] * len(ids)
        for s, (_, start, end) in enumerate(row):
            owner[start:end] = [s] * (end - start)
        mask = batch.get("attention_mask")
        attends = mask[r].tolist() if mask is not None and mask.dim() == 2 else None
        positions = (batch["position_ids"][r].tolist() if "position_ids" in batch
                     else list(range(len(ids))))  # transformers' own when none is passed
        labels = batch["labels"][r].tolist() if kind == "causal_lm" else None
        tokens = []
        for p, tid in enumerate(ids):
            label = labels[p] if labels is not None else None
            tokens.append({
                "id": tid, "token": tokenizer.decode([tid], skip_special_tokens=False),
                "attention": attends[p] if attends is not None else int(owner[p] is not None),
                "example": owner[p], "position": positions[p],
                "label": None if label in (None, IGNORE_INDEX) else label,
                # the label at p is what position p - 1 predicts (the shift inside the loss)
                "loss": label not in (None, IGNORE_INDEX) and p > 0,
            })  # fmt: skip
        entry: dict[str, Any] = {
            "examples": [{"id": examples[i].example_id, "start": a, "end": b}
                         for i, a, b in row],
            "padding": sum(1 for o in owner if o is None),
            "loss_positions": sum(1 for tok in tokens if tok["loss"]),
            "tokens": tokens,
        }  # fmt: skip
        if kind != "causal_lm":
            entry["class"] = _class(int(batch["labels"][r]), names)
        out.append(entry)
    return out


def _class(class_id: int, names: list[str]) -> dict[str, Any]:
    return {"id": class_id, "name": names[class_id] if 0 <= class_id < len(names) else None}


def print_batch_view(view: dict[str, Any], console: Any) -> None:
    """The view for a person: a header per row (its examples and their spans), then one line
    per position: token, attention, position id, label passed to the loss."""
    from rich.table import Table
    from rich.text import Text

    from tunepilot.data.inspect import visible

    packed = view["layout"] == "packed"
    head = (f"the batch as training builds it (data version {view['version']}): update 1, "
            f"microbatch 1 of {view['microbatches_in_update']}, {view['layout']}")
    if packed:
        p = view["packing"]
        head += f" into rows of {p['row_length']} tokens ({p['attention']} attention)"
    shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in view["tensors"].items())
    console.print(Text(head, style="bold"))
    console.print(Text(f"tensors: {shapes}; {view['loss_targets']} position(s) carry loss"))
    for r, row in enumerate(view["rows"]):
        spans = ", ".join(f"{x['id']} [{x['start']}:{x['end']})" for x in row["examples"])
        if "pixels" in row:
            console.print(Text(f"row {r}: {spans}; pixels {'x'.join(map(str, row['pixels']))}; "
                               f"class {row['class']['id']} {row['class']['name']}"))  # fmt: skip
            continue
        said = f"row {r}: {spans}; {row['padding']} padding; {row['loss_positions']} with loss"
        if "class" in row:
            said += f"; class {row['class']['id']} ({row['class']['name']}), loss on the head"
        console.print(Text(said, style="bold cyan"))
        table = Table("t", "id", "token", "example" if packed else "mask", "pos", "label",
                      box=None, pad_edge=False)  # fmt: skip
        for t, tok in enumerate(row["tokens"]):
            where = (str(tok["example"]) if tok["example"] is not None else "pad") if packed else (
                str(tok["attention"]))  # fmt: skip
            label = IGNORED if tok["label"] is None else str(tok["label"])
            style = "bold green" if tok["loss"] else ("dim" if tok["example"] is None else "")
            table.add_row(Text(str(t)), Text(str(tok["id"])), Text(visible(tok["token"])),
                          Text(where), Text(str(tok["position"])), Text(label, style=style))
        console.print(table)
    console.print(Text(f"label {IGNORED}: ignored (IGNORE_INDEX, no loss); the label at t is "
                       "predicted from position t-1; "
                       + ("example: the row's example a token attends within (pad: padding)"
                          if packed else "mask: the attention mask (0: padding)"),
                       style="dim"))  # fmt: skip

