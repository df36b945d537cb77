"""Mixtures of experts end to end: Qwen3-MoE and Mixtral from folders and from GGUF files
(test_parity.py holds their logits against transformers on every backend), the stacked experts
kept as the file stores them, quantized experts on the fast kernels against the dequantised
reference, what the load line and the benchmark count, and one clear error at load for each
way a file's experts can contradict its config."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tiny import make_model
from tiny_gguf import T, dequantised_engine, write_gguf

import inferno
from inferno.errors import InfernoError
from inferno.formats.quant import QuantTensor
from inferno.loading.loader import open_checkpoint

QWEN3_MOE = dict(arch="qwen3_moe", heads=4, kv_heads=2, layers=3, num_experts=8, num_experts_per_tok=2,
                 mlp_only_layers=[1], norm_topk_prob=True)
IDS = [5, 17, 200, 33, 1, 90, 91, 92, 7, 7, 7, 250, 3, 64, 128, 12, 99, 44, 21, 300] * 2


@pytest.fixture(scope="module")
def qwen3moe_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("qwen3moe"), hidden=64, head_dim=16, moe_intermediate_size=32,
                      **QWEN3_MOE)


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("mixtral"), "mixtral", hidden=64, heads=4, kv_heads=2,
                      intermediate=32, num_local_experts=4, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def wide_qwen3moe_dir(tmp_path_factory):
    """Rows of 256: the K-quants' super-blocks."""
    return make_model(tmp_path_factory.mktemp("qwen3moe256"), hidden=256, head_dim=64, intermediate=256,
                      moe_intermediate_size=256, **QWEN3_MOE)


@pytest.mark.parametrize("name", ["qwen3moe_dir", "mixtral_dir"])
def test_f32_gguf_is_the_same_model_as_its_folder(name, request, tmp_path):
    folder = request.getfixturevalue(name)
    gguf_file = write_gguf(folder, tmp_path / "model.gguf")
    ref, got = inferno.load(str(folder), backend="cpu"), inferno.load(str(gguf_file), backend="cpu")
    assert got.config.experts == ref.config.experts
    assert got.config.architecture == ref.config.architecture
    np.testing.assert_allclose(got.logits(IDS), ref.logits(IDS), rtol=0, atol=1e-5)


def test_gguf_experts_stay_as_stored(wide_qwen3moe_dir, tmp_path):
    """One stacked matrix per layer and kind, its rows the file's bytes (nothing copied)."""
    gguf_file = write_gguf(wide_qwen3moe_dir, tmp_path / "q8.gguf",
                           types=lambda n, w, i: T.F32 if w.ndim == 1 else T.Q8_0)
    tensors = open_checkpoint(gguf_file).tensors
    gate = tensors["model.layers.0.mlp.experts.gate_proj.weight"]
    assert isinstance(gate, QuantTensor) and gate.qtype.name == "Q8_0" and gate.shape == (8 * 256, 256)
    assert not gate.data.flags.owndata and not gate.data.flags.writeable  # a view of the map
    assert tensors["model.layers.0.mlp.experts.down_proj.weight"].shape == (8 * 256, 256)
    assert "model.layers.1.mlp.gate_proj.weight" in tensors  # the dense layer between


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4])
@pytest.mark.parametrize("backend", ["simd", "pool"])
def test_quantized_experts_match_the_dequantised_reference(wide_qwen3moe_dir, tmp_path, qtype, backend):
    """Float32 activations: within rounding of the dequantised model, prefill and decode."""
    gguf_file = write_gguf(wide_qwen3moe_dir, tmp_path / f"{qtype.name}.gguf",
                           types=lambda n, w, i: T.F32 if w.ndim == 1 or "gate_inp" in n else qtype)
    want = dequantised_engine(gguf_file).logits(IDS)
    eng = inferno.load(str(gguf_file), backend=backend, int8_activations=False)
    got = eng.logits(IDS)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 1e-4 * scale
    cache = eng.model.new_cache(len(IDS), cache_type="f32")
    eng.model.forward(IDS[:-3], cache)
    for j in range(len(IDS) - 3, len(IDS)):  # decode: one row, the experts' decode kernels
        row = eng.ops.to_numpy(eng.model.forward(IDS[j:j + 1], cache))[0]
        assert np.abs(row - want[j]).max() < 1e-4 * scale


def test_load_line_and_bench_count_the_active_experts(wide_qwen3moe_dir):
    from dataclasses import replace

    eng = inferno.load(str(wide_qwen3moe_dir), backend="cpu")
    experts = 2 * 8 * 3 * 256 * 256  # two sparse layers of 8 experts, three matrices each
    assert eng.parameters - eng.active_parameters == experts * 6 // 8  # 2 of 8 experts a token
    assert eng.size_note.endswith("active a token (2 of 8 experts)")
    model = eng.model
    stacked = sum(w.nbytes for layer in model.layers if layer.experts for w in layer.experts)
    assert stacked == experts * 4  # float32
    two = model.weight_bytes_per_token()
    model.cfg = replace(model.cfg, experts=replace(model.cfg.experts, top_k=8))
    assert model.weight_bytes_per_token() - two == stacked * 6 // 8  # what a token does not read


def test_fused_experts_of_transformers_5_load_as_the_per_expert_folder(qwen3moe_dir, tmp_path):
    """mlp.experts.gate_up_proj [n, 2 inter, hidden] and down_proj [n, hidden, inter]."""
    import shutil

    folder = tmp_path / "fused"
    shutil.copytree(qwen3moe_dir, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    for i in (0, 2):
        p = f"model.layers.{i}.mlp.experts."
        gate = np.stack([tensors.pop(f"{p}{e}.gate_proj.weight") for e in range(8)])
        up = np.stack([tensors.pop(f"{p}{e}.up_proj.weight") for e in range(8)])
        tensors[p + "gate_up_proj"] = np.concatenate([gate, up], axis=1)
        tensors[p + "down_proj"] = np.stack([tensors.pop(f"{p}{e}.down_proj.weight") for e in range(8)])
    save_file(tensors, str(folder / "model.safetensors"))
    want = inferno.load(str(qwen3moe_dir), backend="cpu").logits(IDS)
    np.testing.assert_allclose(inferno.load(str(folder), backend="cpu").logits(IDS), want, rtol=0, atol=1e-6)


# -- bad input: one clear error at load -------------------------------------------------------------
def edit_config(folder, tmp_path, **changes):
    import shutil

    out = tmp_path / "edited"
    shutil.copytree(folder, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("changes,message", [
    (dict(num_experts_per_tok=9), "top-k must be between 1 and the expert count"),
    (dict(num_experts_per_tok=0), "top-k must be between 1 and the expert count"),
    (dict(num_local_experts=16, num_experts=16), "config.json says 16 experts, but"),
    (dict(num_local_experts=4, num_experts=4), "more experts than config.json's 4"),
])
def test_a_folder_whose_experts_contradict_its_config(qwen3moe_dir, tmp_path, changes, message):
    folder = edit_config(qwen3moe_dir, tmp_path, **changes)
    with pytest.raises(InfernoError, match=message):
        inferno.load(str(folder), backend="cpu")


def gguf_with(folder, path, edit):
    """write_gguf's file after `edit(writer_kwargs)`: a metadata key or tensor changed."""
    import gguf

    original = gguf.GGUFWriter.add_tensor
    original_uint32 = gguf.GGUFWriter.add_uint32

    def add_tensor(self, name, t, *args, **kwargs):
        return original(self, name, edit.get(name, lambda a: a)(t), *args, **kwargs)

    def add_uint32(self, key, value):
        return original_uint32(self, key, edit.get(key, lambda v: v)(value))

    gguf.GGUFWriter.add_tensor, gguf.GGUFWriter.add_uint32 = add_tensor, add_uint32
    try:
        return write_gguf(folder, path)
    finally:
        gguf.GGUFWriter.add_tensor, gguf.GGUFWriter.add_uint32 = original, original_uint32


@pytest.mark.parametrize("edit,message", [
    ({"qwen3moe.expert_count": lambda v: 16}, r"mlp.gate.weight is \[8, 64\], the config implies \[16, 64\] "
                                              r"\(the file's metadata or config.json says 16 experts of 32"),
    ({"qwen3moe.expert_used_count": lambda v: 9}, "top-k must be between 1 and the expert count"),
    ({"blk.0.ffn_gate_inp.weight": lambda t: t[:4]}, r"mlp.gate.weight is \[4, 64\], the config implies \[8, 64\]"),
    ({"blk.2.ffn_gate_inp.weight": lambda t: t[:, :32]}, r"mlp.gate.weight is \[8, 32\]"),
])
def test_a_gguf_whose_experts_contradict_its_metadata(qwen3moe_dir, tmp_path, edit, message):
    path = gguf_with(qwen3moe_dir, tmp_path / "bad.gguf", edit)
    with pytest.raises(InfernoError, match=message):
        inferno.load(str(path), backend="cpu")


@pytest.mark.parametrize("backend", ["simd", "pool"])
def test_mxfp4_experts_in_panels_give_the_files_bits(backend):
    """MXFP4 experts repacked into panels at load (experts_weight: lpanels.py) multiply to the
    same bits as the file's rows, for a decode step's one token, a few and a prefill's many
    (every expert's group through m_rows or lgemm's GEMM), on one thread and on the pool's."""
    from inferno.backends import create_backend
    from inferno.backends.numba import lpanels
    from tests.qblocks import random_blocks

    ops = create_backend(backend, **({"threads": 2} if backend == "pool" else {}))
    if not ops._legacy:
        pytest.skip("this CPU takes the legacy kinds' activations in float32: no panels")
    n, hidden, inter = 8, 128, 64
    stack = [random_blocks("MXFP4", n * inter, hidden, seed=1, extremes=False),
             random_blocks("MXFP4", n * inter, hidden, seed=2, extremes=False),
             random_blocks("MXFP4", n * hidden, inter, seed=3, extremes=False)]
    panels = [lpanels.repack(w) for w in stack]
    rng = np.random.default_rng(0)
    router = ops.weight(rng.standard_normal((n, hidden), dtype=np.float32))
    for rows in (1, 3, 40):
        x = rng.standard_normal((rows, hidden), dtype=np.float32)
        np.testing.assert_array_equal(ops.moe(x, router, panels, 2, True), ops.moe(x, router, stack, 2, True),
                                      err_msg=f"{rows} rows")
    ops.close()
