"""Shared fixtures: tiny random models written once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import make_model  # noqa: E402


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> Path:
    """Qwen3, head_dim (24) unlike hidden/heads (16), GQA 2, untied, float32."""
    return make_model(tmp_path_factory.mktemp("qwen3"), "qwen3", hidden=64, heads=4, kv_heads=2,
                      head_dim=24, tied=False)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """Llama (SmolLM2-like), 9 query heads over 3 KV heads (GQA 3), tied, BOS on raw prompts."""
    return make_model(tmp_path_factory.mktemp("llama"), "llama", hidden=72, heads=9, kv_heads=3,
                      tied=True, bos=True)
