"""The `gpu` backend's logic on the CPU: its decode runs the Triton kernel under the interpreter
(the device="cpu" test hook), so its engine must reproduce the reference logits, cached and
uncached, with either loop variant and either prefill path. Without CUDA the registry refuses it
with a message that names the alternative."""

from __future__ import annotations

import importlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined: @triton.jit reads it

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from inferno.backends import create_backend
from inferno.backends.torch import triton_decode  # noqa: E402
from inferno.backends.torch.gpu import GpuBackend  # noqa: E402
from inferno.engine import Engine  # noqa: E402
from inferno.errors import InfernoError  # noqa: E402
from inferno.model.loader import open_checkpoint  # noqa: E402

if not triton_decode.INTERPRET:  # imported earlier in this process for CUDA
    importlib.reload(triton_decode)

IDS = [5, 17, 200, 33, 1, 90, 91, 92, 7, 7, 7, 250, 3, 64, 128, 12, 99, 44, 21, 300] * 4


def engine(model_dir, backend) -> Engine:
    return Engine(open_checkpoint(model_dir), backend)


@pytest.fixture(scope="module")
def cpu_logits(qwen3_dir, llama_dir):
    return {d: engine(d, create_backend("cpu")).logits(IDS) for d in (qwen3_dir, llama_dir)}


@pytest.mark.parametrize("model", ["qwen3_dir", "llama_dir"])
@pytest.mark.parametrize("decode,prefill", [("pingpong", "sdpa"), ("serial", "materialized")])
def test_cached_decode_matches_reference(request, cpu_logits, model, decode, prefill):
    """Qwen3 (head dim 24, GQA 2) and Llama (9 query heads over 3, head dim 8): prefill, a
    chunk after the cache, then token-by-token decode through the kernel."""
    model_dir = request.getfixturevalue(model)
    want = cpu_logits[model_dir]
    eng = engine(model_dir, GpuBackend(decode=decode, prefill=prefill, device="cpu"))
    np.testing.assert_allclose(eng.logits(IDS), want, atol=2e-4)
    m = eng.model
    cache = m.new_cache(len(IDS))
    pieces = [m.forward(IDS[:5], cache), m.forward(IDS[5:70], cache)]
    pieces += [m.forward([t], cache) for t in IDS[70:]]
    cached = np.concatenate([eng.ops.to_numpy(p) for p in pieces])
    np.testing.assert_allclose(cached, want, atol=2e-4)


def test_decode_attention_goes_through_the_kernel(monkeypatch):
    """A batch of sequences in their own slots, with their own lengths and a window, in one
    kernel launch; past each length the cache is NaN (must not be read)."""
    ops = GpuBackend(decode="serial", device="cpu")
    seen = []
    real = triton_decode.decode_attention
    monkeypatch.setattr(triton_decode, "decode_attention",
                        lambda *a, **kw: seen.append(kw["variant"]) or real(*a, **kw))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 16 * 64, generator=g)
    k, v = (ops.kv_buffer(3, 80, 8 * 64) for _ in range(2))
    for buf in (k, v):
        ops.write_kv(buf, 2, 0, torch.randn(70, 8 * 64, generator=g))
        ops.write_kv(buf, 0, 0, torch.randn(33, 8 * 64, generator=g))
        buf[2, 70:], buf[0, 33:], buf[1] = float("nan"), float("nan"), float("nan")
    got = ops.decode_attention(q, k, v, [2, 0], [70, 33], 16, 8, 64, window=20)
    want = triton_decode.reference_attention(q[:, None], k.nan_to_num(), v.nan_to_num(), [70, 33],
                                             16, 8, 64, slots=[2, 0], window=20)
    assert seen == ["serial"]
    torch.testing.assert_close(got.double(), want[:, 0], atol=2e-5, rtol=0)


def test_f16_cache_under_float32_and_no_q8_0():
    ops = GpuBackend(device="cpu")
    k, v = (ops.kv_buffer(1, 50, 2 * 64, "f16") for _ in range(2))
    g = torch.Generator().manual_seed(1)
    for buf in (k, v):
        ops.write_kv(buf, 0, 0, torch.randn(50, 2 * 64, generator=g))
    q = torch.randn(1, 8 * 64, generator=g)
    got = ops.decode_attention(q, k, v, [0], [50], 8, 2, 64)
    assert got.dtype == torch.float32
    want = triton_decode.reference_attention(q, k[0], v[0], 50, 8, 2, 64)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=0)
    with pytest.raises(InfernoError, match="cpu, simd, pool"):
        ops.kv_buffer(1, 50, 128, "q8_0")


def test_registry_refuses_without_cuda():
    if torch.cuda.is_available():  # on a GPU machine the same call builds the backend
        assert create_backend("gpu").device.type == "cuda"
        return
    with pytest.raises(InfernoError, match="needs a CUDA GPU; use --backend torch"):
        create_backend("gpu")
    with pytest.raises(InfernoError, match="needs a CUDA GPU"):
        GpuBackend(device="cuda")


def test_bad_options():
    with pytest.raises(InfernoError, match="pingpong, serial"):
        GpuBackend(decode="zigzag", device="cpu")
    with pytest.raises(InfernoError, match="sdpa, materialized"):
        GpuBackend(prefill="flash", device="cpu")
    with pytest.raises(InfernoError, match="does not apply"):
        create_backend("gpu", device="cpu")  # the registry does not take a device for gpu
