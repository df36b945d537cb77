"""GGUF files of the newer families (Qwen2 with q/k/v biases, Gemma 3 with its four norms a
block and sliding-window layers, Llama 3.1 RoPE frequency factors), written the way llama.cpp's
converter writes them, load into the same model as their Hugging Face folder. The folders are
pinned to transformers by test_parity.py; here the GGUF path is pinned to the folder."""

from __future__ import annotations

import numpy as np
import pytest
from test_parity import GEMMA3_ROPE, LLAMA3_ROPE
from tiny import make_model
from tiny_gguf import write_gguf

import inferno

FAMILIES = {
    "qwen2": dict(arch="qwen2", hidden=64, heads=4, kv_heads=2),
    "llama3-rope-freqs": dict(arch="llama", hidden=64, heads=4, kv_heads=2, head_dim=32,
                              rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, bos=True),
    # llama.cpp reads no layer pattern, local RoPE base or query scale from a Gemma 3 file: it
    # fixes them (every sixth layer global, base 10000, 1/sqrt(head_dim)), so the folder does too.
    "gemma3": dict(arch="gemma3", hidden=64, heads=4, kv_heads=1, head_dim=40, layers=6, tied=True,
                   sliding_window=16, query_pre_attn_scalar=40, rope_parameters=GEMMA3_ROPE,
                   layer_types=["sliding_attention"] * 5 + ["full_attention"]),
}
IDS = [5, 17, 200, 33, 1, 90, 91, 92, 7, 7, 7, 250, 3, 64, 128, 12, 99, 44, 21, 300] * 2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gguf_is_the_same_model_as_its_folder(family, tmp_path):
    folder = make_model(tmp_path / "hf", **FAMILIES[family])
    ref = inferno.load(str(folder), progress=False)
    got = inferno.load(str(write_gguf(folder, tmp_path / "model.gguf")), progress=False)
    for name in ("architecture", "activation", "attention_scale", "layer_windows",
                 "rope_local_theta", "tie_word_embeddings", "head_dim"):
        assert getattr(got.config, name) == getattr(ref.config, name), name
    np.testing.assert_allclose(got.config.inv_freq(), ref.config.inv_freq(), rtol=1e-6)
    np.testing.assert_allclose(got.logits(IDS), ref.logits(IDS), rtol=0, atol=2e-5)
