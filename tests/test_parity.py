"""Whole-model parity: our logits against transformers' Qwen3ForCausalLM / LlamaForCausalLM (and
the other families, mixtures of experts among them) on tiny random models, on every backend; cached decode against the uncached forward; greedy
generation identical across backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import inferno
from tiny import make_model

BACKENDS = ["cpu", "simd", "pool", "torch"]
OPTIONS = {"torch": {"device": "cpu"}}

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}  # short, so every regime shows at 80 tokens
# YaRN as gpt-oss has it (truncate off) over a short original context, so that at head dim 32
# the ramp between kept and interpolated frequencies spans dimensions 0.3 to 5.
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 256}
GEMMA3_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}

# name -> make_model arguments. Between them: Qwen3, Llama, Qwen2 and Gemma 3; tied and untied;
# head_dim unlike hidden/heads; GQA groups 1, 2, 3 and 4 with odd head counts; float32 and
# bfloat16 files; Llama 3.1 RoPE scaling; q/k/v biases; Gemma's local and global layers mixed with
# a window (24) smaller than the test sequence; mixtures of experts: Qwen3-MoE with a dense layer
# between sparse ones (renormalised top-k) and with experts every second layer (bfloat16, not
# renormalised), Mixtral; gpt-oss (sinks, biases on every projection and expert, its clamped
# SwiGLU, YaRN on windowed and global layers alike).
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
MODELS = {
    "qwen3-untied-hd24-gqa2-f32": dict(arch="qwen3", hidden=64, heads=4, kv_heads=2, head_dim=24),
    "qwen3-tied-gqa1-bf16": dict(arch="qwen3", hidden=64, heads=4, kv_heads=4, tied=True, dtype="bfloat16"),
    "llama-tied-9q3kv-f32": dict(arch="llama", hidden=72, heads=9, kv_heads=3, tied=True, bos=True),
    "llama-untied-gqa2-bf16": dict(arch="llama", hidden=64, heads=4, kv_heads=2, head_dim=32,
                                   dtype="bfloat16", rope_theta=500000.0),
    "llama3-rope-scaling-f32": dict(arch="llama", hidden=64, heads=4, kv_heads=2, head_dim=32,
                                    rope_theta=500000.0, rope_scaling=LLAMA3_ROPE),
    "qwen2-biases-gqa2-f32": dict(arch="qwen2", hidden=64, heads=4, kv_heads=2),
    "gemma3-window24-hd40-gqa4-f32": dict(
        arch="gemma3", hidden=64, heads=4, kv_heads=1, head_dim=40, layers=3, tied=True,
        sliding_window=24, query_pre_attn_scalar=32, rope_parameters=GEMMA3_ROPE,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    "qwen3moe-dense-between-f32": dict(arch="qwen3_moe", hidden=64, heads=4, kv_heads=2, head_dim=16,
                                       layers=3, mlp_only_layers=[1], norm_topk_prob=True, **MOE),
    "qwen3moe-step2-bf16": dict(arch="qwen3_moe", hidden=64, heads=4, kv_heads=2, layers=4,
                                decoder_sparse_step=2, norm_topk_prob=False, dtype="bfloat16", **MOE),
    "mixtral-f32": dict(arch="mixtral", hidden=64, heads=4, kv_heads=2, intermediate=32,
                        num_local_experts=4, num_experts_per_tok=2),
    "gpt-oss-window24-yarn-f32": dict(arch="gpt_oss", hidden=64, heads=4, kv_heads=2, head_dim=32,
                                      layers=3, intermediate=32, num_local_experts=4,
                                      num_experts_per_tok=2, sliding_window=24, rope_parameters=GPT_OSS_ROPE,
                                      max_positions=2048),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model_dir(request, tmp_path_factory):
    return make_model(tmp_path_factory.mktemp(request.param), **MODELS[request.param])


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model


def hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="module", params=BACKENDS)
def engine(request, model_dir):
    eng = inferno.load(model_dir, backend=request.param, progress=False, **OPTIONS.get(request.param, {}))
    yield eng
    eng.close()


IDS = [5, 17, 200, 33, 1, 90, 91, 92, 7, 7, 7, 250, 3, 64, 128, 12, 99, 44, 21, 300] * 4  # 80 > one tile


def test_logits_match_transformers(engine, reference):
    ours = engine.logits(IDS)
    theirs = hf_logits(reference, IDS)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    # Scale-aware: the logits are O(5); float32 reordering gives ~1e-5.
    err = np.abs(ours - theirs).max()
    assert err < 2e-4 * max(1.0, np.abs(theirs).max()), f"max abs diff {err}"
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() > 0.95


# f32 caches reproduce the uncached pass to float rounding; the backend's default cache (f16 on
# simd and pool, as llama.cpp keeps it) rounds each K and V to 11 bits.
@pytest.mark.parametrize("cache_type,tolerance", [("f32", 1e-4), (None, 1e-2)], ids=["f32", "default"])
def test_cached_decode_matches_uncached(engine, cache_type, tolerance):
    """Prefill a prompt, append a multi-token chunk after the cache, then decode one token at a
    time: every position's logits equal the uncached forward's."""
    full = engine.logits(IDS)
    model = engine.model
    cache = model.new_cache(len(IDS), cache_type=cache_type)
    pieces = [model.forward(IDS[:5], cache)]  # prefill
    pieces.append(model.forward(IDS[5:70], cache))  # a chunk after the cache crossing a tile edge
    for tok in IDS[70:]:
        pieces.append(model.forward([tok], cache))  # decode
    cached = np.concatenate([engine.ops.to_numpy(p) for p in pieces])
    assert cache.length == len(IDS)
    err = np.abs(cached - full).max()
    assert err < tolerance * max(1.0, np.abs(full).max()), f"max abs diff {err}"


def test_greedy_generation_is_the_same_on_every_backend(engine, model_dir):
    cpu = inferno.load(model_dir, backend="cpu", progress=False)
    want = cpu.generate("Once upon a time", max_tokens=24, temperature=0).token_ids
    got = engine.generate("Once upon a time", max_tokens=24, temperature=0).token_ids
    assert got == want


def test_flash_off_matches_flash_on(model_dir):
    on = inferno.load(model_dir, backend="cpu", progress=False)
    off = inferno.load(model_dir, backend="cpu", progress=False, flash=False)
    np.testing.assert_allclose(off.logits(IDS), on.logits(IDS), atol=1e-4)


def test_gemma3_multimodal_folder_runs_its_text_model(tmp_path_factory):
    """A Gemma3ForConditionalGeneration folder: the text model's config under text_config and
    its weights under model.language_model.* (transformers 5) beside a vision tower. inferno
    runs the text model, the same one as a gemma3_text folder."""
    import json

    from safetensors.numpy import load_file, save_file

    text = make_model(tmp_path_factory.mktemp("gemma3-text"), **MODELS["gemma3-window24-hd40-gqa4-f32"])
    multi = tmp_path_factory.mktemp("gemma3-multimodal")
    for f in text.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            (multi / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((text / "config.json").read_text())
    (multi / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {k: v for k, v in cfg.items() if k != "architectures"},
        "vision_config": {"hidden_size": 8}, "eos_token_id": cfg["eos_token_id"]}))
    weights = {n.replace("model.", "model.language_model.", 1): w
               for n, w in load_file(text / "model.safetensors").items()}
    weights["model.vision_tower.patch_embedding.weight"] = np.ones((8, 3), np.float32)
    save_file(weights, multi / "model.safetensors")
    want = inferno.load(text, backend="cpu", progress=False).logits(IDS)
    got = inferno.load(multi, backend="cpu", progress=False)
    assert got.config.architecture == "gemma3" and got.config.layer_windows == (24, 0, 24)
    np.testing.assert_array_equal(got.logits(IDS), want)
