"""gpt-oss: its config (YaRN, alternating windows, the experts' biases and clamp), a GGUF laid out
as llama.cpp's converter writes one, and a folder whose experts are MXFP4 `_blocks` and
`_scales`, each the same model as the float folder. Logits against transformers on every
backend are in tests/test_parity.py (the gpt-oss entry of its MODELS)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import inferno
from inferno.errors import InfernoError
from inferno.model.config import ModelConfig
from tiny import make_model
from tiny_gguf import write_gguf

IDS = [5, 17, 200, 33, 1, 90, 91, 92, 7, 7, 7, 250, 3, 64, 128, 12, 99, 44, 21, 300] * 2  # 40 > the window

# YaRN with the ramp's ends rounded (truncate on): what llama.cpp computes whatever the
# checkpoint says, so that the folder and its GGUF are one model.
ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": True, "original_max_position_embeddings": 256}
GPT_OSS = dict(arch="gpt_oss", hidden=64, heads=4, kv_heads=2, head_dim=32, layers=2, intermediate=64,
               num_local_experts=4, num_experts_per_tok=2, sliding_window=16, rope_parameters=ROPE,
               max_positions=2048)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("gptoss"), **GPT_OSS)


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_frequencies_and_scale_are_transformers(truncate):
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {**ROPE, "truncate": truncate}
    theirs = GptOssConfig(head_dim=64, num_attention_heads=4, num_key_value_heads=2, hidden_size=256,
                          rope_parameters=rope,
                          max_position_embeddings=2048)
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](theirs)
    ours = ModelConfig.from_hf({**theirs.to_dict(), "architectures": ["GptOssForCausalLM"]})
    np.testing.assert_allclose(ours.inv_freq(), inv.double().numpy(), rtol=1e-6)
    assert ours.rope_attention_factor == pytest.approx(factor)
    # the windowed layers turn with the same (scaled) frequencies: no base of their own
    np.testing.assert_array_equal(ours.inv_freq(local=True), ours.inv_freq())


def test_config_of_a_gpt_oss_folder(folder):
    cfg = inferno.load(str(folder), backend="cpu", progress=False).config
    assert cfg.architecture == "gpt_oss" and cfg.family.sinks and cfg.family.o_bias
    assert cfg.layer_windows == (16, 0)  # even layers windowed, odd ones global
    assert (cfg.experts.count, cfg.experts.top_k, cfg.experts.norm_topk) == (4, 2, True)
    assert cfg.experts.bias and cfg.experts.clamp == (1.702, 7.0)


def test_gguf_is_the_same_model_as_its_folder(folder, tmp_path):
    path = write_gguf(folder, tmp_path / "gptoss.gguf")
    ref = inferno.load(str(folder), backend="cpu", progress=False)
    got = inferno.load(str(path), backend="cpu", progress=False)
    assert got.config.layer_windows == ref.config.layer_windows
    assert got.config.experts == ref.config.experts
    np.testing.assert_allclose(got.logits(IDS), ref.logits(IDS), rtol=0, atol=1e-5)


@pytest.mark.parametrize("tensor,message", [
    ("model.layers.1.self_attn.sinks", "model.layers.1.self_attn.sinks"),
    ("model.layers.0.mlp.experts.down_proj_bias", "down_proj_bias is missing")])
def test_a_folder_missing_a_tensor_says_which(folder, tmp_path, tensor, message):
    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors[tensor]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(InfernoError, match=message):
        inferno.load(str(broken), backend="cpu", progress=False)


def test_yarn_with_deepseek_mscale_is_refused():
    cfg = {"architectures": ["GptOssForCausalLM"], "vocab_size": 100, "hidden_size": 64, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
           "rope_parameters": {**ROPE, "mscale": 0.7, "mscale_all_dim": 0.7}}
    with pytest.raises(InfernoError, match="mscale"):
        ModelConfig.from_hf(cfg)
    del cfg["rope_parameters"]["mscale"], cfg["rope_parameters"]["mscale_all_dim"]
    assert ModelConfig.from_hf(cfg).rope_scaling.rope_type == "yarn"


def test_a_bfloat16_folder_is_the_same_model_to_its_rounding(folder, tmp_path):
    """A bfloat16 copy of the folder (gpt-oss's own dtype for everything but the experts):
    its biases and router are 16-bit matrices, its sinks 16-bit vectors."""
    want = inferno.load(str(folder), backend="cpu", progress=False)
    bf16 = make_model(tmp_path / "bf16", dtype="bfloat16", **GPT_OSS)
    got = inferno.load(str(bf16), backend="cpu", progress=False)
    cfg = json.loads((bf16 / "config.json").read_text())
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
    ours, theirs = got.logits(IDS), want.logits(IDS)
    assert np.abs(ours - theirs).max() < 0.05 * np.abs(theirs).max()  # bfloat16 weights


def hf_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [..., out, in] quantised to MXFP4 by the gguf package, in the checkpoint's layout:
    blocks [..., out, in / 32, 16] (byte j: elements 2j low, 2j + 1 high) and scales
    [..., out, in / 32]: quant.mxfp4_from_hf's inverse."""
    from gguf import GGMLQuantizationType, quantize

    *lead, cols = w.shape
    ggml = quantize(np.ascontiguousarray(w, np.float32).reshape(-1, cols), GGMLQuantizationType.MXFP4)
    ggml = ggml.reshape(-1, cols // 32, 17)
    q = np.concatenate([ggml[..., 1:] & 15, ggml[..., 1:] >> 4], axis=-1)  # elements 0..31 in order
    blocks = q[..., 0::2] | (q[..., 1::2] << 4)
    # contiguous: safetensors' numpy writer takes a view's buffer as it lies
    return (np.ascontiguousarray(blocks.reshape(*lead, cols // 32, 16)),
            np.ascontiguousarray(ggml[..., 0].reshape(*lead, cols // 32)))


@pytest.fixture(scope="module")
def mxfp4_folder(folder, tmp_path_factory):
    """The folder with its experts in MXFP4, as openai/gpt-oss-20b ships them (bfloat16 around)."""
    from safetensors.numpy import load_file, save_file

    out = tmp_path_factory.mktemp("gptoss-mxfp4")
    for f in folder.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    tensors = load_file(str(folder / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = hf_mxfp4(tensors.pop(name).swapaxes(-1, -2))  # stored [n_expert, in, out]
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("backend", ["cpu", "simd", "pool", "torch"])
def test_mxfp4_folder_matches_transformers(mxfp4_folder, backend):
    """transformers dequantises the blocks on a CPU (convert_moe_packed_tensors); inferno keeps
    them as stored and multiplies them in place."""
    import torch
    from transformers import AutoModelForCausalLM, Mxfp4Config

    ref = AutoModelForCausalLM.from_pretrained(mxfp4_folder, dtype=torch.float32,
                                               quantization_config=Mxfp4Config(dequantize=True)).eval()
    with torch.no_grad():
        want = ref(torch.tensor([IDS])).logits[0].float().numpy()
    eng = inferno.load(str(mxfp4_folder), backend=backend, progress=False)
    gate = eng.model.layers[0].experts[0]
    assert getattr(gate, "qtype", None) is None or gate.qtype.name == "MXFP4"
    got = eng.logits(IDS)
    assert np.abs(got - want).max() < 2e-4 * max(1.0, np.abs(want).max())
