"""What is particular to the `torch` backend: device and dtype selection, weights on the device
once (tied embeddings shared), tensors that stay on the device, the chunked materialized
attention, and timing through the tracing backend. Logit parity with transformers runs for
`torch` in test_parity.py, every op against the reference in tests/ops/."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import inferno
from inferno.backends import OPS, create_backend
from inferno.backends.base import MATERIALIZED_PARTS
from inferno.backends.torch import torch_backend as tb
from inferno.backends.base import Backend
from inferno.errors import InfernoError

IDS = [5, 17, 200, 33, 1, 90, 91, 92, 7, 7, 7, 250, 3, 64, 128, 12, 99, 44, 21, 300]


def expected_default() -> str:
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def test_default_device_is_cuda_then_mps_then_cpu():
    assert tb.TorchBackend().device.type == expected_default()
    assert tb.TorchBackend(device="cpu").device == torch.device("cpu")


@pytest.mark.parametrize("device", ["cuda:99", "tpu", "not a device", "mps:3"])
def test_unavailable_device_names_the_available_ones(device):
    with pytest.raises(InfernoError) as e:
        create_backend("torch", device=device)
    msg = str(e.value)
    assert repr(device) in msg and "available:" in msg and "cpu" in msg.split("available:")[1]


def test_dtype_option():
    assert tb.TorchBackend(device="cpu").dtype == torch.float32
    assert tb.TorchBackend(device="cpu", dtype="f32").dtype == torch.float32
    assert tb.TorchBackend(device="cpu", dtype="bf16").dtype == torch.bfloat16
    with pytest.raises(InfernoError, match="f32, bf16"):
        create_backend("torch", device="cpu", dtype="f16")
    with pytest.raises(InfernoError, match="does not apply"):
        create_backend("cpu", dtype="bf16")


def test_every_op_is_torch():
    """No op falls through to the numpy default (which would silently copy to the host or
    fail on a device tensor); materialized_attention and linear_many are generic compositions
    of ops."""
    inherited = [op for op in OPS + MATERIALIZED_PARTS + ("from_numpy", "weight", "to_numpy", "zeros", "synchronize",
                                     "kv_buffer")
                 if getattr(tb.TorchBackend, op) is getattr(Backend, op)]
    assert inherited == ["linear_many", "materialized_attention"]


def test_tensors_stay_on_the_device_and_views_are_views():
    ops = tb.TorchBackend(device="cpu")
    table = ops.from_numpy(np.arange(12, dtype=np.float32).reshape(6, 2))
    assert isinstance(table, torch.Tensor) and table.dtype == torch.float32
    e = ops.embedding(table, np.array([4, 0, 4]))  # numpy ids in, device rows out
    assert e.tolist() == [[8, 9], [0, 1], [8, 9]]
    cos, sin = ops.rope_tables(np.arange(3), np.array([1.0, 0.5]))
    assert isinstance(cos, torch.Tensor) and cos.shape == (3, 2) and cos.dtype == torch.float32
    np.testing.assert_allclose(ops.to_numpy(sin), np.sin(np.outer(np.arange(3), [1.0, 0.5])), atol=1e-7)

    cache = ops.zeros(5, 2)
    assert cache.device == ops.device and cache.dtype == ops.dtype
    ops.write_rows(cache, table[:2], 3)  # in place
    assert cache[3:].tolist() == [[0, 1], [2, 3]]
    view = ops.rows(cache, 3, 5)
    view[0, 0] = 42.0  # a view: the cache sees it
    assert cache[3, 0].item() == 42.0
    dst = ops.zeros(2, 4)
    assert ops.copy_2d_into_cols(dst, table[:2], 2) is dst and dst[1].tolist() == [0, 0, 2, 3]
    out = ops.to_numpy(ops.linear(table, table[:3]))
    assert out.dtype == np.float32 and out.shape == (6, 3)


def test_tied_embeddings_are_one_device_tensor(llama_dir):
    eng = inferno.load(llama_dir, backend="torch", device="cpu", progress=False)
    assert eng.config.tie_word_embeddings
    assert eng.model.lm_head is eng.model.embed_tokens


def test_untied_embeddings_stay_separate(qwen3_dir):
    eng = inferno.load(qwen3_dir, backend="torch", device="cpu", progress=False)
    assert eng.model.lm_head.data_ptr() != eng.model.embed_tokens.data_ptr()


def test_bf16_weights_activations_and_cache(qwen3_dir):
    f32 = inferno.load(qwen3_dir, backend="torch", device="cpu", progress=False)
    bf16 = inferno.load(qwen3_dir, backend="torch", device="cpu", dtype="bf16", progress=False)
    assert bf16.model.layers[0].qkv[0].dtype == torch.bfloat16
    assert bf16.model.new_cache(4).k[0].dtype == torch.bfloat16
    want, got = f32.logits(IDS), bf16.logits(IDS)
    assert got.dtype == np.float32 and np.all(np.isfinite(got))
    # bfloat16 keeps 8 bits of mantissa: close to float32, nowhere near equal.
    err = np.abs(got - want).max()
    assert 1e-4 < err < 0.05 * np.abs(want).max(), f"max abs diff {err}"
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.8
    # and its cached decode agrees with its own uncached pass
    cache = bf16.model.new_cache(len(IDS))
    pieces = [bf16.model.forward(IDS[:12], cache)] + [bf16.model.forward([t], cache) for t in IDS[12:]]
    cached = np.concatenate([bf16.ops.to_numpy(p) for p in pieces])
    assert np.abs(cached - got).max() < 0.05 * np.abs(want).max()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seq_q,seq_k", [(37, 37), (20, 90)])
def test_chunked_scores_equal_one_piece(monkeypatch, causal, seq_q, seq_k):
    """Long prompts are cut into row chunks to bound the score memory: each chunk keeps its
    rows' causal offsets, so the result equals the one-piece computation."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(seq_q, 6 * 16, generator=g)
    k = torch.randn(seq_k, 2 * 16, generator=g)
    v = torch.randn(seq_k, 2 * 16, generator=g)
    whole = tb.materialized_gqa(q, k, v, 6, 2, 16, causal)
    monkeypatch.setattr(tb, "SCORE_BYTES", 4 * 6 * seq_k * 7)  # 7 query rows per chunk
    chunked = tb.materialized_gqa(q, k, v, 6, 2, 16, causal)
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=0)


def test_trace_times_every_op_between_device_syncs(qwen3_dir, monkeypatch):
    syncs = []
    monkeypatch.setattr(tb.TorchBackend, "synchronize", lambda self: syncs.append(1))
    eng = inferno.load(qwen3_dir, backend="torch", device="cpu", trace=True, progress=False)
    result = eng.generate("Once upon a time", max_tokens=4, temperature=0)
    calls = dict((op, n) for op, n, _, _ in eng.ops.histogram())
    assert calls["flash_attention_prefill"] == eng.config.num_hidden_layers  # one prefill
    assert calls["decode_attention"] == eng.config.num_hidden_layers * (result.generated_tokens - 1)
    # two syncs around every op, plus the engine's own before timing
    assert len(syncs) >= 2 * sum(calls.values())
    assert "decode_attention" in eng.ops.format_histogram()


def test_greedy_text_matches_cpu(llama_dir):
    cpu = inferno.load(llama_dir, backend="cpu", progress=False)
    tor = inferno.load(llama_dir, backend="torch", device="cpu", progress=False)
    a = cpu.generate("The capital of France", max_tokens=12, temperature=0, raw=True)
    b = tor.generate("The capital of France", max_tokens=12, temperature=0, raw=True)
    assert b.text == a.text and b.peak_memory_bytes > 0
