"""Shared fixtures. Real-data tests skip cleanly when ../shared/data is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _shared_data_dir() -> Path | None:
    for candidate in (REPO.parent / "shared" / "data", Path("/work/shared/data")):
        if (candidate / "SOURCES.md").is_file():
            return candidate
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real public datasets, or a clean skip when this checkout has none."""
    found = _shared_data_dir()
    if found is None:
        pytest.skip("../shared/data is absent on this machine")
    return found


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-layer Llama + BPE tokenizer saved once per test session."""
    from tunepilot.model.tiny import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-layer BERT encoder (no head) + BPE tokenizer saved once per test session."""
    from tunepilot.model.tiny import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_chat_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with a chat template ({% generation %} tags) and role-header tokens."""
    from tunepilot.model.tiny import TINY_CHAT_TEMPLATE, build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-chat"), chat_template=TINY_CHAT_TEMPLATE)
