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
def base_model_dir(qwen3_dir, tmp_path_factory) -> Path:
    """The tiny Qwen3 without a chat template, as a base model ships."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("base") / "model"
    shutil.copytree(qwen3_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """Llama (SmolLM2-like), 9 query heads over 3 KV heads (GQA 3), tied, BOS on raw prompts."""
    return make_model(tmp_path_factory.mktemp("llama"), "llama", hidden=72, heads=9, kv_heads=3,
                      tied=True, bos=True)
