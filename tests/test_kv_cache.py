"""KV cache types: f32, f16, bf16 and q8_0 buffers on the CPU backends, f32/f16/bf16 on torch.

The numpy reference (cache_types.py) is pinned to numpy's own float16 rounding, to torch's and
gguf's bfloat16, and to gguf's Q8_0 quantizer (ggml's reference, bit for bit). The Numba
kernels (kv_kernels.py) are pinned to that reference byte for byte on write and exactly on read;
their decode attention, which reads the cache in its type, is pinned to the float32 reference
run on the very values the cache holds (read_kv), so the agreement is float32-tight.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from inferno.formats import cache_types
from inferno.backends import create_backend
from inferno.backends.numba import kv_kernels as KV
from inferno.backends.base import CACHE_TYPES
from inferno.backends.cpu import CpuBackend
from inferno.backends.numba.pool import PoolBackend
from inferno.backends.numba.simd import SimdBackend
from inferno.errors import InfernoError

REF = CpuBackend()
Q8_0 = gguf.GGMLQuantizationType.Q8_0


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def hard_rows(width=96):
    """Rows that probe the conversions: zero blocks, huge and tiny values (f16 subnormals,
    overflow past f16's range), exact rounding ties for Q8_0 (x / d = k + 0.5) and for f16/bf16,
    negative zero, and plain random rows."""
    rows = [np.zeros(width), rand(width, seed=1), rand(width, seed=2, scale=1e-6),
            rand(width, seed=3, scale=3e4), np.full(width, -0.0)]
    tie = np.tile(np.arange(-63.5, 64.5, 1.0)[:32], width // 32) / 127 * 2.0
    tie[0] = 2.0  # max |x| = 2: d = 2/127, so x / d lands on halves
    rows.append(tie)
    rows.append(np.resize([1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, 65520.0, 1e-8], width))
    return np.array(rows, dtype=np.float32)


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


# -- the Numba conversions and writes against the reference -----------------------------------------
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


CPU_VARIANTS = ["cpu", "simd", "pool"]


@pytest.fixture(scope="module", params=CPU_VARIANTS)
def cpu_ops(request):
    backend = create_backend(request.param)
    yield backend
    backend.close()


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_write_and_read_round_trip(cpu_ops, cache_type):
    """Bytes equal to the reference's, read back exactly, neighbours untouched."""
    x = np.concatenate([hard_rows(), rand(20, 96, seed=4)])
    buf = cpu_ops.kv_buffer(3, 40, 96, cache_type)
    assert buf.shape == (3, 40, cache_types.row_elements(cache_type, 96))
    assert buf.dtype == cache_types.DTYPES[cache_type]
    with np.errstate(over="ignore"):
        cpu_ops.write_kv(buf, 1, 9, x)
        stored = cache_types.encode(x, cache_type)
    assert np.array_equal(buf[1, 9:9 + len(x)].view(np.uint8), stored.view(np.uint8))
    assert not buf[1, :9].any() and not buf[1, 9 + len(x):].any() and not buf[[0, 2]].any()
    got = cpu_ops.read_kv(buf, 1, 9, 9 + len(x))
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.array_equal(got, cache_types.decode(stored), equal_nan=True)
    if cache_type == "f32":
        assert np.array_equal(got, x)


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_write_kv_rows_scatters_like_write_kv(cpu_ops, cache_type):
    """A batched step's rows, one per sequence, into their own slots and positions in one call:
    the same bytes as one write_kv per row; the rest of the buffer untouched."""
    x = np.concatenate([hard_rows(), rand(3, 96, seed=5)])[:6]
    slots, positions = np.array([2, 0, 1, 3, 2, 0]), np.array([5, 0, 39, 7, 6, 1])
    got, want = cpu_ops.kv_buffer(4, 40, 96, cache_type), cpu_ops.kv_buffer(4, 40, 96, cache_type)
    with np.errstate(over="ignore"):
        cpu_ops.write_kv_rows(got, slots, positions, x)
        for i in range(len(x)):
            REF.write_kv(want, int(slots[i]), int(positions[i]), x[i:i + 1])
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_write_kv_rows_on_torch():
    from inferno.backends.torch.torch_backend import TorchBackend
    ops = TorchBackend(device="cpu")
    buf = ops.kv_buffer(3, 8, 64, "f16")
    x = rand(2, 64, seed=6)
    ops.write_kv_rows(buf, [2, 0], [7, 3], ops.from_numpy(x))
    back = ops.to_numpy(ops.read_kv(buf, 2, 7, 8)), ops.to_numpy(ops.read_kv(buf, 0, 3, 4))
    assert np.array_equal(np.concatenate(back), x.astype(np.float16).astype(np.float32))
    assert int((buf != 0).sum()) == 2 * 64


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


@pytest.mark.parametrize("backend", ["simd", "pool"])
def test_kernels_refuse_rows_outside_the_buffer(backend):
    """The Numba kernels do not check bounds: the backend does, before it calls them."""
    ops = create_backend(backend)
    buf = ops.kv_buffer(2, 8, 64, "q8_0")
    for slot, start, rows in [(2, 0, rand(1, 64)), (0, 7, rand(2, 64)), (0, -1, rand(1, 64))]:
        with pytest.raises(ValueError, match="outside"):
            ops.write_kv(buf, slot, start, rows)
    with pytest.raises(ValueError, match="features"):
        ops.write_kv(buf, 0, 0, rand(1, 96))
    with pytest.raises(ValueError, match="outside"):
        ops.read_kv(buf, 0, 3, 9)
    for slots, positions in [([0, 2], [0, 0]), ([0, 1], [8, 0]), ([0, 1], [0, -1])]:
        with pytest.raises(ValueError, match="outside"):
            ops.write_kv_rows(buf, slots, positions, rand(2, 64))
    with pytest.raises(ValueError, match="2 rows need 2 slots"):
        ops.write_kv_rows(buf, [0], [0, 1], rand(2, 64))
    with pytest.raises(ValueError, match="features"):
        ops.write_kv_rows(buf, [0], [0], rand(1, 96))
    ops.close()


@pytest.mark.parametrize("backend", ["simd", "pool"])
def test_q8_0_kernels_need_whole_blocks_per_head(backend):
    """The Numba kernels read a head's blocks; 4 heads of 16 would split blocks between heads
    (the numpy reference dequantizes whole rows and does not mind)."""
    ops = create_backend(backend)
    k, v = (ops.kv_buffer(1, 4, 64, "q8_0") for _ in range(2))
    with pytest.raises(InfernoError, match="head dim"):
        ops.decode_attention(rand(1, 64), k, v, [0], [3], 4, 4, 16)
    ops.close()


# -- decode attention in every cache type ------------------------------------------------------------
# q8_0 caches need head dims in whole blocks of 32 (test_q8_0_kernels_need_whole_blocks_per_head)
DECODE_GEOMETRIES = [((9, 3, 64), 0), ((9, 3, 64), 5), ((4, 1, 256), 100), ((16, 8, 128), 0),
                     ((6, 2, 24), 0), ((2, 1, 8), 3)]


@pytest.mark.parametrize("cache_type,geometry,window",
                         [(ct, g, w) for ct in CACHE_TYPES for g, w in DECODE_GEOMETRIES
                          if ct != "q8_0" or g[2] % 32 == 0], ids=str)
def test_decode_reads_each_cache_type(cpu_ops, cache_type, geometry, window):
    """Against the float32 reference on the rounded K/V the cache holds: float32-tight. Head
    dims of 24 and 8 take the kernels' element-by-element tail past the last 16."""
    h, kv, hd = geometry
    slots, kv_lens = [2, 0], [129, 64]
    bufs = [cpu_ops.kv_buffer(3, 140, kv * hd, cache_type) for _ in range(2)]
    for i, buf in enumerate(bufs):
        for slot in range(3):
            cpu_ops.write_kv(buf, slot, 0, rand(140, kv * hd, seed=10 * i + slot, scale=2.0))
    q = rand(2, h * hd, seed=7)
    want = []
    for b, (slot, n) in enumerate(zip(slots, kv_lens)):
        first = max(0, n - window) if window else 0
        k, v = (cpu_ops.read_kv(buf, slot, first, n) for buf in bufs)
        want.append(REF.materialized_attention(q[b:b + 1], k, v, h, kv, hd, True))
    got = cpu_ops.decode_attention(q, bufs[0], bufs[1], slots, kv_lens, h, kv, hd, window)
    want = np.concatenate(want)
    err = np.abs(got - want).max()
    assert got.dtype == np.float32 and err < 2e-6 * max(1.0, np.abs(want).max()), f"max abs diff {err:.3g}"


def test_pool_splits_agree_with_simd_on_q8_0():
    """The pool cuts long caches into key ranges and merges them; in q8_0 too."""
    simd, pool = SimdBackend(), PoolBackend(threads=2)
    pool.parallel_min_attention, pool.decode_min_keys = 0, 32
    k, v = (simd.kv_buffer(2, 900, 192, "q8_0") for _ in range(2))
    for i, buf in enumerate((k, v)):
        simd.write_kv(buf, 0, 0, rand(900, 192, seed=i))
        simd.write_kv(buf, 1, 0, rand(900, 192, seed=i + 5))
    q = rand(2, 9 * 64, seed=3)
    a = simd.decode_attention(q, k, v, [1, 0], [900, 333], 9, 3, 64)
    b = pool.decode_attention(q, k, v, [1, 0], [900, 333], 9, 3, 64)
    assert np.abs(a - b).max() < 2e-6
    simd.close()
    pool.close()


# -- torch: caches as torch dtypes ---------------------------------------------------------------------
def test_torch_cache_dtypes():
    f32 = create_backend("torch", device="cpu")
    bf16 = create_backend("torch", device="cpu", dtype="bf16")
    assert f32.default_cache_type == "f32" and bf16.default_cache_type == "bf16"
    assert f32.kv_buffer(2, 8, 64).dtype == torch.float32
    assert bf16.kv_buffer(2, 8, 64).dtype == torch.bfloat16
    assert f32.kv_buffer(2, 8, 64, "f16").dtype == torch.float16
    with pytest.raises(InfernoError, match="cpu, simd, pool"):
        f32.kv_buffer(2, 8, 64, "q8_0")


@pytest.mark.parametrize("cache_type", ["f16", "bf16"])
def test_torch_narrow_cache_under_float32(cache_type):
    """An f16 or bf16 cache under float32 activations: stored rounded as torch rounds, read back
    as float32, and decode equals the reference on those values."""
    ops = create_backend("torch", device="cpu")
    k, v = (ops.kv_buffer(2, 100, 192, cache_type) for _ in range(2))
    x = rand(100, 192, seed=1)
    ops.write_kv(k, 1, 0, ops.from_numpy(x))
    ops.write_kv(v, 1, 0, ops.from_numpy(rand(100, 192, seed=2)))
    read = ops.read_kv(k, 1, 0, 100)
    assert read.dtype == torch.float32
    assert torch.equal(read, torch.from_numpy(x).to(k.dtype).float())
    q = rand(1, 9 * 64, seed=3)
    got = ops.to_numpy(ops.decode_attention(ops.from_numpy(q), k, v, [1], [90], 9, 3, 64, 30))
    kr, vr = (ops.to_numpy(ops.read_kv(b, 1, 60, 90)) for b in (k, v))
    want = REF.materialized_attention(q, kr, vr, 9, 3, 64, True)
    assert np.abs(got - want).max() < 2e-6
