"""Commands that read a campaign before any training: validate, schema, init, data audit/show."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunepilot.cli.app import (
    CampaignArgs,
    JsonFlag,
    app,
    data_app,
    open_workspace,
    run_body,
    split_campaign_args,
)

# ---------------------------------------------------------------------------------------------
# campaign file
# ---------------------------------------------------------------------------------------------


@app.command()
def validate(args: CampaignArgs = None, as_json: JsonFlag = False) -> None:
    """Check a campaign file without training anything: every problem at once, each with its
    key path, what was found and the fix; then whether the plan can do what it says on the
    prepared training split (a warm-up longer than the budget, no validation point inside the
    run, one update, an update larger than the training set) and whether every declared guard
    can be judged for the task. Never imports torch. Exit 0, 1 when a plan check FAILs, 2 on
    bad input.

    Example: tunepilot validate campaign.yaml training.lr=5e-5
    """

    def body() -> int:
        from tunepilot.campaign import load_campaign
        from tunepilot.campaign.checks import campaign_warnings, raise_on_problems
        from tunepilot.console import console, error_console, print_json, warn
        from tunepilot.train.feasibility import check_plan_on_data
        from tunepilot.verdict import Verdict, exit_code

        path, overrides = split_campaign_args(args)
        campaign = load_campaign(path, overrides)
        root = path.resolve().parent
        raise_on_problems(campaign, root, str(path))
        warnings = campaign_warnings(campaign)
        for w in warnings:
            warn(str(w))
        plan = check_plan_on_data(campaign, root)
        for f in plan:
            if f.verdict is not Verdict.PASS:
                colour = "red" if f.verdict is Verdict.FAIL else "yellow"
                error_console.print(f"[bold {colour}]{f.verdict}[/] {f.check}: {f.sentence}",
                                    highlight=False)  # fmt: skip
        code = exit_code(plan)
        if as_json:
            print_json(
                {
                    "ok": code == 0,
                    "campaign": campaign.model_dump(mode="json"),
                    "config_hash": campaign.config_hash(),
                    "warnings": [str(w) for w in warnings],
                    "plan": [f.to_json() for f in plan],
                }
            )
        else:
            t = campaign.training
            word = "[bold green]ok[/]" if code == 0 else "[bold red]FAIL[/]"
            console.print(
                f"{word} {path}: campaign [bold]{campaign.name}[/], task "
                f"{campaign.hypothesis.task}, model {campaign.model.name_or_path} "
                f"({campaign.model.method}), {len(campaign.variants)} variant(s) x "
                f"{len(campaign.seeds)} seed(s), microbatch {t.microbatch} x accumulation "
                f"{t.accumulation}, config hash {campaign.config_hash()}"
            )
        return code

    run_body(body)


@app.command()
def schema() -> None:
    """Print the campaign file's JSON Schema (point your editor's YAML plugin at it).

    Example: tunepilot schema > campaign.schema.json
    """
    from tunepilot.campaign import json_schema
    from tunepilot.console import print_json

    print_json(json_schema())


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Folder for the new campaign.")],
    task: Annotated[
        str, typer.Option(help="classification | extraction | format | image_classification | chat")
    ] = "classification",
    force: Annotated[bool, typer.Option(help="Overwrite an existing campaign.yaml.")] = False,
    from_axolotl: Annotated[
        Path | None,
        typer.Option(
            "--from-axolotl", help="Convert this Axolotl YAML; keys not carried go to stderr."
        ),
    ] = None,
) -> None:
    """Write a commented campaign.yaml that starts with the command that runs it.

    Example: tunepilot init tickets --task classification
    Example: tunepilot init my-run --from-axolotl examples/llama-3/lora-1b.yml
    """

    def body() -> int:
        from tunepilot.console import console, error_console

        if from_axolotl is not None:
            from tunepilot.campaign.axolotl import not_carried_lines, write_from_axolotl

            path, unknown = write_from_axolotl(directory, from_axolotl, force=force)
            if unknown:
                error_console.print(f"not carried over from {from_axolotl} ({len(unknown):,}):")
                for item in not_carried_lines(unknown, from_axolotl):
                    error_console.print(f"  {item}", highlight=False, markup=False, soft_wrap=True)
            console.print(f"wrote {path}\nnext: state the hypothesis, then "
                          f"[bold]tunepilot validate {path}[/]")  # fmt: skip
            return 0
        from tunepilot.campaign.templates import write_template

        path = write_template(directory, task, force=force)
        console.print(f"wrote {path}\nnext: [bold]tunepilot validate {path}[/]")
        return 0

    run_body(body)


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


NoTokenizer = Annotated[
    bool, typer.Option("--no-tokenizer", help="Skip the token-length and truncation checks.")
]


@data_app.command("audit")
def data_audit(
    args: CampaignArgs = None,
    as_json: JsonFlag = False,
    no_tokenizer: NoTokenizer = False,
) -> None:
    """Audit the campaign's data: duplicates, near-duplicates, leakage by group or time,
    labels, class balance, label mapping and truncation. Exit 1 when a check FAILs.

    Example: tunepilot data audit campaign.yaml data.split.policy=group
    """

    def body() -> int:
        from tunepilot.data.flow import audit_workspace

        return audit_workspace(open_workspace(args), as_json, not no_tokenizer)

    run_body(body)


@data_app.command("show")
def data_show(
    args: CampaignArgs = None,
    n: Annotated[int, typer.Option("-n", min=0, help="Examples to show.")] = 3,
    per_class: Annotated[
        int, typer.Option("--per-class", min=0, help="Also show K examples of each class (D4).")
    ] = 0,
    split: Annotated[str, typer.Option(help="train | validation | test")] = "train",
    batch: Annotated[
        bool, typer.Option("--batch", help="Show one real training microbatch from collate "
                           "(padded or packed): ids, mask or example boundaries, position ids, "
                           "labels passed to the loss, per row, decoded (D3).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show examples after the exact encoding the trainer uses: tokens, separators, the
    positions that carry loss, the truncation point and the expected target (D3-D5). With
    --batch, the first microbatch a run trains, as collate builds it (saved as
    data/<version>/batch.json for the dossier).

    Example: tunepilot data show campaign.yaml -n 2 --per-class 1 --split validation

    Example: tunepilot data show campaign.yaml --batch data.packing=true
    """

    def body() -> int:
        if batch:
            from tunepilot.console import console, print_json
            from tunepilot.experiments.batch_view import batch_view, print_batch_view

            view = batch_view(open_workspace(args))
            print_json(view) if as_json else print_batch_view(view, console)
            return 0
        from tunepilot.data.flow import show_workspace

        return show_workspace(open_workspace(args), split, n, per_class, as_json)

    run_body(body)
