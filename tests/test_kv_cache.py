"""KV cache types: f32, f16, bf16 and q8_0 buffers on the CPU backends, f32/f16/bf16 on torch.

The numpy reference (cache_types.py) is pinned to numpy's own float16 rounding, to torch's and
gguf's bfloat16, and to gguf's Q8_0 quantizer (ggml's reference, bit for bit); the Numba
kernels' half conversions (kv_kernels.py) to numpy's, on every half and on random float32 bit
patterns. Then which buffer each backend makes, and what it refuses. The cache ops themselves
(write_kv, write_kv_rows, read_kv, copy_kv, decode_attention in every cache type) are pinned to
the reference on every backend in tests/ops/.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from ops.helpers import hard_rows, rand

from inferno.formats import cache_types
from inferno.backends import create_backend
from inferno.backends.numba import kv_kernels as KV
from inferno.backends.cpu import CpuBackend
from inferno.backends.numba.pool import PoolBackend
from inferno.backends.numba.simd import SimdBackend
from inferno.errors import InfernoError

REF = CpuBackend()
Q8_0 = gguf.GGMLQuantizationType.Q8_0


# -- the numpy reference against numpy, torch and gguf ---------------------------------------------
def test_f16_is_numpy_rounding():
    x = hard_rows()
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    assert np.array_equal(cache_types.decode(cache_types.encode(x, "f16")), want)


def test_bf16_is_torch_and_gguf_rounding():
    x = np.concatenate([hard_rows(), rand(50, 96, seed=9)])
    bits = cache_types.bf16_bits(x)
    assert np.array_equal(bits, torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(bits, gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16).view(np.uint16))
    back = cache_types.decode(bits)
    assert np.array_equal(back, torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy())


def test_q8_0_is_gguf_quantize_bit_for_bit():
    x = np.concatenate([hard_rows(), rand(50, 96, seed=11, scale=5.0)])
    stored = cache_types.quantize_q8_0(x)
    assert stored.shape == (x.shape[0], 96 // 32 * 34) and stored.dtype == np.uint8
    assert np.array_equal(stored, gguf.quants.quantize(x, Q8_0))
    assert np.array_equal(cache_types.decode(stored), gguf.quants.dequantize(stored, Q8_0))


# -- the Numba conversions against numpy's ----------------------------------------------------------
def test_half_intrinsics_are_exact():
    every_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty((1, 1 << 16), np.float32)
    KV.read_rows(every_half.reshape(1, 1, -1).view(np.uint8), KV.F16, 0, 0, out)
    want = every_half.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(out[0][~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.all(np.isnan(out[0][nan]))
    # float32 -> half on random bit patterns (every exponent: subnormals, overflow, NaN)
    x = np.random.default_rng(0).integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    raw = np.zeros((1, 1, 2 * x.size), np.uint8)
    KV.write_rows(x.reshape(1, -1), raw, KV.F16, 0, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16)
    got = raw.view(np.float16).ravel()
    assert np.array_equal(got[~np.isnan(x)].view(np.uint16), want[~np.isnan(x)].view(np.uint16))
    assert np.all(np.isnan(got[np.isnan(x)]))


# -- the buffers: default types, refusals -------------------------------------------------------------
@pytest.fixture(scope="module", params=["cpu", "simd", "pool"])
def cpu_ops(request):
    backend = create_backend(request.param)
    yield backend
    backend.close()


def test_defaults():
    assert REF.default_cache_type == "f32"  # the reference
    assert SimdBackend.default_cache_type == PoolBackend.default_cache_type == "f16"  # llama.cpp's
    assert REF.kv_buffer(1, 4, 64).dtype == np.float32
    assert SimdBackend().kv_buffer(1, 4, 64).dtype == np.float16


def test_bad_cache_types(cpu_ops):
    with pytest.raises(InfernoError, match="f32, f16, bf16, q8_0"):
        cpu_ops.kv_buffer(1, 4, 64, "q4_0")
    with pytest.raises(InfernoError, match="multiple of 32"):
        cpu_ops.kv_buffer(1, 4, 48, "q8_0")


def test_torch_cache_dtypes():
    f32 = create_backend("torch", device="cpu")
    bf16 = create_backend("torch", device="cpu", dtype="bf16")
    assert f32.default_cache_type == "f32" and bf16.default_cache_type == "bf16"
    assert f32.kv_buffer(2, 8, 64).dtype == torch.float32
    assert bf16.kv_buffer(2, 8, 64).dtype == torch.bfloat16
    assert f32.kv_buffer(2, 8, 64, "f16").dtype == torch.float16
    with pytest.raises(InfernoError, match="cpu, simd, pool"):
        f32.kv_buffer(2, 8, 64, "q8_0")

