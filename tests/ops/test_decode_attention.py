"""decode_attention: one step for a batch of sequences, each its newest query row against its
own cache slot, read in place, pinned to the textbook attention (helpers.materialized_reference)
over the rows the slot holds as read back through read_kv: so the comparison is float32-tight in
every cache type, the narrow ones included.

Batches put sequences in different slots with different lengths on both sides of the 64-key tile
edge, in each backend's default cache type, over GQA groups 1 to 4 with odd head counts (9:3),
Qwen3-0.6B's 16:8 at head dim 128 and Gemma 3 270M's 4:1 at head dim 256, and windows smaller
than the lengths. Every position a step must not read is NaN (past each length, older than the
window, the slots no row uses), so a kernel that loads one poisons its output. Long lengths make
pool-eager cut each sequence's keys into several ranges (its split-and-merge path).

gpu runs its Triton kernel under Triton's interpreter, about 0.1 s a launch: a part of the batch
grid, and the kernel's own cases in tests/test_triton_decode.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import (NUMBA, VARIANTS, assert_close, assert_exact, decode_reference, filled_cache, host,
                         materialized_reference, poison_unread, rand, random_sinks, stores)

from inferno.backends.base import CACHE_TYPES
from inferno.errors import InfernoError

GPU = True
DECODE_BATCHES = [  # (slots, kv_lens): different slots, lengths on both sides of tile edges
    ([3, 0, 2], [1, 64, 129]),
    ([1, 2, 0, 3], [65, 127, 200, 63]),
]
GEOMETRIES = [(9, 3, 64), (8, 2, 128), (4, 1, 256), (16, 8, 128), (4, 4, 16)]
WINDOWS = [0, 1, 5, 64, 100]


def decode(backend, q, k_buf, v_buf, slots, kv_lens, *args):
    return host(backend, backend.decode_attention(backend.from_numpy(q), k_buf, v_buf, slots, kv_lens, *args))


def check_batch(backend, batch, window, geometry):
    slots, kv_lens = batch
    h, kv, hd = geometry
    k_buf, v_buf = filled_cache(backend, window + hd, 4, 210, kv * hd)
    q = np.random.default_rng(hd).standard_normal((len(slots), h * hd), dtype=np.float32)
    want = decode_reference(backend, q, k_buf, v_buf, slots, kv_lens, h, kv, hd, window)
    poison_unread(backend, (k_buf, v_buf), kv * hd, slots, kv_lens, window)
    got = decode(backend, q, k_buf, v_buf, slots, kv_lens, h, kv, hd, window)
    assert_close(got, want)
    # the batch is only a batch: each row equals its own single-sequence step
    for b in range(len(slots)):
        one = decode(backend, q[b:b + 1], k_buf, v_buf, slots[b:b + 1], kv_lens[b:b + 1], h, kv, hd, window)
        assert np.abs(one - got[b:b + 1]).max() < 1e-6


@pytest.mark.backends(*VARIANTS)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("batch", DECODE_BATCHES, ids=["B3", "B4"])
def test_decode_attention_batch(backend, batch, window, geometry):
    check_batch(backend, batch, window, geometry)


@pytest.mark.backends("gpu")
@pytest.mark.parametrize("geometry", GEOMETRIES[:3] + GEOMETRIES[4:], ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
@pytest.mark.parametrize("window", [0, 5, 100])
@pytest.mark.parametrize("batch", DECODE_BATCHES, ids=["B3", "B4"])
def test_decode_attention_batch_in_one_launch(backend, batch, window, geometry):
    """test_decode_attention_batch's grid on the Triton kernel, without 16:8x128 (the
    interpreter's slowest launch; test_triton_decode.py has 16:8) and with three windows: none,
    within a tile, past one."""
    check_batch(backend, batch, window, geometry)


@pytest.mark.parametrize("window", [0, 1, 70, 500])
@pytest.mark.parametrize("kv_lens", [[1, 128, 129], [600, 64, 1000]])
def test_decode_attention_reads_only_its_keys(backend, kv_lens, window):
    """Slots 1, 3, 0 of four, float32 cache; only the positions a step reads are written, every
    other is NaN. Long lengths make pool-eager cut the keys into several ranges."""
    slots, capacity, width = [1, 3, 0], 1040, 3 * 64
    rng = np.random.default_rng(len(kv_lens) + window)
    k_buf, v_buf = (backend.kv_buffer(4, capacity, width, "f32") for _ in range(2))
    nan = backend.from_numpy(np.full((capacity, width), np.nan, np.float32))
    for buf in (k_buf, v_buf):
        for slot in range(4):
            backend.write_kv(buf, slot, 0, nan)
    q = rand(3, 9 * 64, seed=window)
    want = []
    for b, (slot, n) in enumerate(zip(slots, kv_lens)):
        first = max(0, n - window) if window else 0
        k, v = (rng.standard_normal((n - first, width), dtype=np.float32) for _ in range(2))
        backend.write_kv(k_buf, slot, first, backend.from_numpy(k))
        backend.write_kv(v_buf, slot, first, backend.from_numpy(v))
        want.append(materialized_reference(q[b:b + 1], k, v, 9, 3, 64, True))
    assert_close(decode(backend, q, k_buf, v_buf, slots, kv_lens, 9, 3, 64, window), np.concatenate(want))


@pytest.mark.parametrize("window", [0, 5, 100])
@pytest.mark.parametrize("batch", DECODE_BATCHES, ids=["B3", "B4"])
def test_decode_attention_with_index_tensors(backend, batch, window):
    """slots and lengths as the backend's index tensors (ops.indices), which the device-resident
    decode step passes and which a GPU backend reads without a host round trip: the same rows
    as with host lists, every unread position NaN as above."""
    slots, kv_lens = batch
    h, kv, hd = 9, 3, 64
    k_buf, v_buf = filled_cache(backend, window + hd, 4, 210, kv * hd)
    q = np.random.default_rng(window).standard_normal((len(slots), h * hd), dtype=np.float32)
    want = decode_reference(backend, q, k_buf, v_buf, slots, kv_lens, h, kv, hd, window)
    poison_unread(backend, (k_buf, v_buf), kv * hd, slots, kv_lens, window)
    got = decode(backend, q, k_buf, v_buf, backend.indices(slots), backend.indices(kv_lens), h, kv, hd, window)
    assert_close(got, want)


def test_decode_attention_scale(backend):
    k_buf, v_buf = filled_cache(backend, 1, 2, 150, 256)
    q = np.random.default_rng(2).standard_normal((2, 4 * 256), dtype=np.float32)
    want = decode_reference(backend, q, k_buf, v_buf, [1, 0], [140, 9], 4, 1, 256, 64, 0.0625)
    assert_close(decode(backend, q, k_buf, v_buf, [1, 0], [140, 9], 4, 1, 256, 64, 0.0625), want)


def test_decode_attention_checks_its_batch(backend):
    k_buf, v_buf = filled_cache(backend, 1, 2, 10, 32)
    q = backend.from_numpy(np.zeros((2, 64), np.float32))
    for slots, lens in [([0], [3]), ([0, 2], [3, 3]), ([0, 1], [3, 11]), ([0, 1], [0, 3])]:
        with pytest.raises(ValueError, match="slots|outside"):
            backend.decode_attention(q, k_buf, v_buf, slots, lens, 2, 1, 32)
    with pytest.raises(ValueError, match="heads"):
        backend.decode_attention(q, k_buf, v_buf, [0, 1], [3, 3], 3, 1, 32)  # q holds 2 heads, not 3
    with pytest.raises(ValueError, match="one shape"):
        backend.decode_attention(q, k_buf, backend.kv_buffer(2, 12, 32), [0, 1], [3, 3], 2, 1, 32)


# -- every cache type ---------------------------------------------------------------------------------
# q8_0 caches need head dims in whole blocks of 32 (test_q8_0_kernels_need_whole_blocks_per_head).
# 8:2x64 with no window and 9:3x64 with 30 are torch's and gpu's f16 (and bf16) cases of old.
DECODE_GEOMETRIES = [((9, 3, 64), 0), ((9, 3, 64), 5), ((4, 1, 256), 100), ((16, 8, 128), 0),
                     ((6, 2, 24), 0), ((2, 1, 8), 3), ((8, 2, 64), 0), ((9, 3, 64), 30)]


@pytest.mark.parametrize("cache_type,geometry,window",
                         [(ct, g, w) for ct in CACHE_TYPES for g, w in DECODE_GEOMETRIES
                          if ct != "q8_0" or g[2] % 32 == 0], ids=str)
def test_decode_reads_each_cache_type(backend, cache_type, geometry, window):
    """Against the float32 reference on the rounded K/V the cache holds: float32-tight. Head
    dims of 24 and 8 take the Numba kernels' element-by-element tail past the last 16."""
    if not stores(backend, cache_type):
        return
    h, kv, hd = geometry
    slots, kv_lens = [2, 0], [129, 64]
    bufs = [backend.kv_buffer(3, 140, kv * hd, cache_type) for _ in range(2)]
    for i, buf in enumerate(bufs):
        for slot in range(3):
            rows = rand(140, kv * hd, seed=10 * i + slot, scale=2.0)
            backend.write_kv(buf, slot, 0, backend.from_numpy(rows))
    q = rand(2, h * hd, seed=7)
    want = decode_reference(backend, q, *bufs, slots, kv_lens, h, kv, hd, window)
    assert_close(decode(backend, q, *bufs, slots, kv_lens, h, kv, hd, window), want)


@pytest.mark.parametrize("cache_type,geometry,window",
                         [(ct, g, w) for ct in CACHE_TYPES for g, w in [((9, 3, 64), 0), ((8, 2, 128), 100)]],
                         ids=str)
def test_decode_attention_sinks(backend, cache_type, geometry, window):
    """gpt-oss's attention sinks, one logit per query head (head 0's -inf: none; +5s that
    outweigh the keys), in every cache type, unread positions NaN. B4's lengths make pool-eager
    cut a row's keys into up to 8 ranges: the sink must join once per row and head, not once a
    range. On the Numba kernels all -inf is today's result bit for bit."""
    if not stores(backend, cache_type):
        return
    slots, kv_lens = DECODE_BATCHES[1]
    h, kv, hd = geometry
    k_buf, v_buf = filled_cache(backend, window + 3, 4, 210, kv * hd, cache_type)
    q = rand(len(slots), h * hd, seed=hd)
    sinks = random_sinks(h, seed=window)
    want = decode_reference(backend, q, k_buf, v_buf, slots, kv_lens, h, kv, hd, window, None, sinks)
    with np.errstate(invalid="ignore"):  # q8_0 quantizes NaN rows to NaN scales, casting NaN
        poison_unread(backend, (k_buf, v_buf), kv * hd, slots, kv_lens, window)
    args = (q, k_buf, v_buf, slots, kv_lens, h, kv, hd, window, None)
    assert_close(decode(backend, *args, backend.from_numpy(sinks)), want)
    if backend.name in ("simd", "pool"):
        none = backend.from_numpy(np.full(h, -np.inf, np.float32))
        assert_exact(decode(backend, *args, none), decode(backend, *args))


@pytest.mark.backends(*NUMBA)
def test_q8_0_kernels_need_whole_blocks_per_head(backend):
    """The Numba kernels read a head's blocks; 4 heads of 16 would split blocks between heads
    (the numpy reference dequantizes whole rows and does not mind)."""
    k, v = (backend.kv_buffer(1, 4, 64, "q8_0") for _ in range(2))
    with pytest.raises(InfernoError, match="head dim"):
        backend.decode_attention(rand(1, 64), k, v, [0], [3], 4, 4, 16)


def test_pool_splits_agree_with_simd_on_q8_0():
    """The pool cuts long caches into key ranges and merges them; in q8_0 too."""
    from inferno.backends.numba.pool import PoolBackend
    from inferno.backends.numba.simd import SimdBackend
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


# -- gpu: the Triton kernel ---------------------------------------------------------------------------
@pytest.mark.backends("gpu")
@pytest.mark.parametrize("variant", ["pingpong", "serial"])
def test_decode_attention_goes_through_the_kernel(backend, variant, monkeypatch):
    """A batch of sequences in their own slots, with their own lengths and a window, in one
    kernel launch of either loop variant; past each length the cache is NaN (must not be read).
    Against the kernel module's float64 reference."""
    import torch
    from inferno.backends.torch import triton_decode
    monkeypatch.setattr(backend, "decode_variant", variant)
    seen = []
    real = triton_decode.decode_attention
    monkeypatch.setattr(triton_decode, "decode_attention",
                        lambda *a, **kw: seen.append(kw["variant"]) or real(*a, **kw))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 16 * 64, generator=g)
    k, v = (backend.kv_buffer(3, 80, 8 * 64) for _ in range(2))
    for buf in (k, v):
        backend.write_kv(buf, 2, 0, torch.randn(70, 8 * 64, generator=g))
        backend.write_kv(buf, 0, 0, torch.randn(33, 8 * 64, generator=g))
        buf[2, 70:], buf[0, 33:], buf[1] = float("nan"), float("nan"), float("nan")
    got = backend.decode_attention(q, k, v, [2, 0], [70, 33], 16, 8, 64, window=20)
    want = triton_decode.reference_attention(q[:, None], k.nan_to_num(), v.nan_to_num(), [70, 33],
                                             16, 8, 64, slots=[2, 0], window=20)
    assert seen == [variant]
    torch.testing.assert_close(got.double(), want[:, 0], atol=2e-5, rtol=0)
