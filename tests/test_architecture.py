"""The package layout holds (README "Architecture"): no import circles, small modules.

`lint-imports` checks that stages import only downwards; it cannot see a circle between two
modules of one package. This test builds the import graph with grimp (import-linter's own
graph library, every import statement counted, lazy and TYPE_CHECKING ones included) and
fails on any import that lies on a circle.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tunepilot"
MAX_LINES = 400


def _circles(graph) -> list[tuple[str, str]]:
    """Every import a -> b where b also reaches a: an edge on a circle."""
    return sorted(
        (a, b)
        for a in graph.modules
        for b in graph.find_modules_directly_imported_by(a)
        if graph.chain_exists(importer=b, imported=a)
    )


def test_architecture_no_module_imports_itself_back_through_a_circle() -> None:
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("tunepilot")
    assert _circles(graph) == []


def test_architecture_the_circle_finder_sees_a_planted_circle(tmp_path, monkeypatch) -> None:
    grimp = pytest.importorskip("grimp")
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from planted import b\n")
    (pkg / "b.py").write_text("from planted import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    expected = [("planted.a", "planted.b"), ("planted.b", "planted.a")]
    assert _circles(grimp.build_graph("planted")) == expected


def test_architecture_every_module_is_at_most_400_lines() -> None:
    over = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert over == {}
