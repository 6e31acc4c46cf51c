"""Every YAML text a user hands over is read with a bound on what its aliases expand to: the
campaign file, a command-line override, the GPU catalog (`--catalog`) and an Axolotl config
(`--from-axolotl`). A short file of nested anchors is refused naming the file and the anchor's
line before any value is built, instead of costing minutes and gigabytes; ordinary anchors
and a large file without aliases still read."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tunepilot.campaign import load_campaign
from tunepilot.campaign.axolotl import read_axolotl
from tunepilot.errors import InputError
from tunepilot.sizing.catalog import default_catalog_path, load_catalog

TUNEPILOT = [sys.executable, "-m", "tunepilot.cli"]
CAMPAIGN = """name: t
hypothesis: {behaviour: route tickets, task: classification}
model: {name_or_path: minilm}
data: {file: data.jsonl, fields: {label: queue}}
"""


def alias_bomb(levels: int, fan: int = 9) -> str:
    """`levels` anchors, each a list of `fan` aliases to the one before: fan**levels values."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _refused(exc: InputError, path: Path) -> None:
    (problem,) = exc.problems
    assert problem.where.startswith(f"{path}:"), problem.where  # the file and the anchor's line
    assert "alias" in problem.found and "reuse fewer anchors" in problem.fix


def test_an_alias_bomb_prepended_to_a_campaign_is_refused_with_the_file_and_line(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text(alias_bomb(6) + CAMPAIGN, encoding="utf-8")  # 531,441 values from 1 KB
    with pytest.raises(InputError) as info:
        load_campaign(path)
    _refused(info.value, path)
    assert info.value.problems[0].where == f"{path}:5"  # a4, the last anchor aliased (9 times)


def test_an_alias_bomb_in_a_command_line_override_is_refused_naming_the_argument(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text(CAMPAIGN, encoding="utf-8")
    value = "[" + ", ".join(["&a [x, x, x, x, x, x, x, x, x]"] + ["*a"] * 20_000) + "]"
    with pytest.raises(InputError) as info:
        load_campaign(path, [f"seeds={value}"])
    assert "command-line override `seeds=" in info.value.problems[0].where
    assert "alias" in info.value.problems[0].found


def test_an_alias_bomb_in_a_gpu_catalog_or_an_axolotl_config_is_refused(tmp_path):
    catalog = tmp_path / "gpus.yaml"
    catalog.write_text(alias_bomb(6) + default_catalog_path().read_text(encoding="utf-8"))
    with pytest.raises(InputError) as info:
        load_catalog(catalog)
    _refused(info.value, catalog)
    axolotl = tmp_path / "lora.yml"
    axolotl.write_text(alias_bomb(6) + "base_model: ./model\nadapter: lora\n")
    with pytest.raises(InputError) as info:
        read_axolotl(axolotl)
    _refused(info.value, axolotl)


def test_the_cli_refuses_a_nine_level_bomb_with_exit_2(tmp_path):
    """9 levels (387 million values) gave no answer in 180 s: now one sentence and exit 2."""
    path = tmp_path / "campaign.yaml"
    path.write_text(alias_bomb(9) + CAMPAIGN, encoding="utf-8")
    done = subprocess.run([*TUNEPILOT, "validate", str(path)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"{path.name}:8" in done.stderr and "alias" in done.stderr


def test_ordinary_anchors_and_a_large_file_without_aliases_still_read(tmp_path):
    from tunepilot.campaign.yaml_reader import MAX_ALIAS_VALUES, read_yaml

    shared = CAMPAIGN + (
        "lora: &lora {r: 8, alpha: 16}\n"
        "x-variants: [*lora, *lora, *lora]\n"
    )
    value = read_yaml(shared, "campaign.yaml", "invalid campaign")
    assert value["x-variants"] == [{"r": 8, "alpha": 16}] * 3
    big = "".join(f"key_{i}: value {i}\n" for i in range(2 * MAX_ALIAS_VALUES))
    assert len(read_yaml(big, "big.yml", "invalid")) == 2 * MAX_ALIAS_VALUES


def test_the_expansion_is_measured_on_the_node_graph_without_expanding_it():
    """What the check sees for a 12-level bomb (282 billion values): counted, never built."""
    from tunepilot.campaign.yaml_reader import alias_problem

    root = yaml.compose(alias_bomb(12), Loader=yaml.SafeLoader)
    found, line = alias_problem(root)
    assert line == 11 and "alias uses" in found
    expanded = int(re.search(r"to ([\d,]+)", found)[1].replace(",", ""))
    assert expanded > 9**12
