"""ModelConfig from config.json: the fields that change the math come from the file."""

from __future__ import annotations

import numpy as np
import pytest

from inferno.errors import InfernoError
from inferno.model.config import ModelConfig

BASE = dict(architectures=["Qwen3ForCausalLM"], vocab_size=100, hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=128, tie_word_embeddings=False)


def test_rope_theta_top_level_or_in_rope_parameters():
    a = ModelConfig.from_hf({**BASE, "rope_theta": 5e5})
    b = ModelConfig.from_hf({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert a.rope_theta == b.rope_theta == 5e5


def test_head_dim_explicit_or_derived():
    assert ModelConfig.from_hf({**BASE, "rope_theta": 1e4}).head_dim == 16
    assert ModelConfig.from_hf({**BASE, "rope_theta": 1e4, "head_dim": 128}).head_dim == 128


def test_qwen3_has_qk_norm_llama_does_not():
    assert ModelConfig.from_hf({**BASE, "rope_theta": 1e4}).qk_norm
    assert not ModelConfig.from_hf({**BASE, "rope_theta": 1e4, "architectures": ["LlamaForCausalLM"]}).qk_norm


def test_eos_ids_merge_config_and_generation_config():
    cfg = ModelConfig.from_hf({**BASE, "rope_theta": 1e4, "eos_token_id": 7}, extra_eos=(9, 7))
    assert cfg.eos_token_ids == (7, 9)


def test_llama3_rope_scaling_keeps_short_wavelengths():
    cfg = ModelConfig.from_hf({**BASE, "rope_theta": 5e5, "head_dim": 64, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}})
    plain = ModelConfig.from_hf({**BASE, "rope_theta": 5e5, "head_dim": 64}).inv_freq()
    scaled = cfg.inv_freq()
    assert scaled[0] == plain[0]  # highest frequency untouched
    assert np.isclose(scaled[-1], plain[-1] / 8)  # lowest slowed by the factor


@pytest.mark.parametrize("change,message", [
    ({"architectures": ["MistralForCausalLM"]}, "unsupported architecture MistralForCausalLM"),
    ({"num_key_value_heads": 3}, "must be a multiple"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_theta": None}, "rope_theta"),
    ({"rope_theta": 1e4, "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope type 'longrope'"),
])
def test_bad_configs_are_clear_errors(change, message):
    cfg = {**BASE, "rope_theta": 1e4, **change}
    if cfg["rope_theta"] is None:
        del cfg["rope_theta"]
    with pytest.raises(InfernoError, match=message.replace("(", r"\(")):
        ModelConfig.from_hf(cfg)
