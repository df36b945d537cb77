"""The simd and pool backends pinned to the cpu reference: every kernel at sequence lengths on both
sides of the 64-key tile edge, GQA groups 1, 2 and 3, odd head counts, query offsets and decode
over a cache; then whole models: logits equal cpu's within float32 rounding, greedy generation
gives the same tokens.

"pool-eager" is the pool with its size thresholds at zero, so every op, however small, runs as a
parallel launch (at the default thresholds small test shapes would take the serial path), and
its decode cuts each sequence's keys into ranges of 16 or more, so the split-and-merge path runs;
"pool-1" is the pool on one thread.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import inferno
from inferno.backends.numba import blas
from inferno.backends import create_backend
from inferno.backends.numba import dense as K
from inferno.backends.cpu import CpuBackend
from inferno.backends.numba.pool import PoolBackend
from inferno.backends.numba.simd import SimdBackend
from inferno.errors import InfernoError

SEQS = [1, 17, 63, 64, 65, 100, 200]
GEOMETRIES = [(4, 4, 16), (4, 2, 32), (9, 3, 64), (6, 2, 24)]  # (n_heads, n_kv_heads, head_dim)
REF = CpuBackend()


def make(variant: str):
    if variant == "simd":
        return SimdBackend()
    if variant == "pool-1":
        return PoolBackend(threads=1)
    backend = PoolBackend(threads=2)
    if variant == "pool-eager":
        backend.parallel_min_elements = backend.parallel_min_attention = 0
        backend.decode_min_keys = 16
    return backend


@pytest.fixture(scope="module", params=["simd", "pool", "pool-eager", "pool-1"])
def ops(request):
    backend = make(request.param)
    yield backend
    backend.close()


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def assert_close(got, want, tol=2e-6):
    """Equal within float32 rounding, relative to the output's scale."""
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.all(np.isfinite(got) == np.isfinite(want))
    finite = np.isfinite(want)
    err = np.abs(got[finite] - want[finite]).max(initial=0.0)
    scale = max(1.0, np.abs(want[finite]).max(initial=0.0))
    assert err <= tol * scale, f"max abs diff {err:.3g} (scale {scale:.3g})"


# -- the exp every softmax and SwiGLU uses --------------------------------------------------------
def test_exp_into_matches_float64_exp():
    x = np.concatenate([np.linspace(-87.3, 88.0, 200_001, dtype=np.float32),
                        np.array([0.0, -1e-8, 1e-8, -87.0, -0.5], dtype=np.float32)])
    out = np.empty_like(x)
    K.exp_into(x, out, np.empty(x.shape, np.int32), x.size)
    want = np.exp(x.astype(np.float64))
    rel = np.abs(out - want) / want
    assert rel.max() < 4e-7, f"max relative error {rel.max():.3g}"


def test_exp_into_edges():
    """Zero below float32's range (masked scores are -inf); NaN in, NaN out."""
    x = np.array([-np.inf, -1e30, -200.0, -88.0, np.nan], dtype=np.float32)
    out = np.full_like(x, 7.0)
    K.exp_into(x, out, np.empty(x.shape, np.int32), x.size)
    assert np.array_equal(out[:4], np.zeros(4, np.float32)) and np.isnan(out[4])


# -- dense ops ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", SEQS)
def test_linear(ops, rows):
    x, w = rand(rows, 96, seed=rows), rand(150, 96, seed=1)  # 150 outputs: not a multiple of 4
    assert_close(ops.linear(x, ops.weight(w)), REF.linear(x, w))


def test_linear_lm_head_shape(ops):
    """A matvec big enough for the pool to split (and rows not a multiple of the split)."""
    x, w = rand(1, 576, seed=3), rand(4099, 576, seed=4)
    assert_close(ops.linear(x, ops.weight(w)), REF.linear(x, w))


@pytest.mark.parametrize("rows", [1, 17, 65])
def test_matmul(ops, rows):
    a, b = rand(rows, 64, seed=5), rand(64, 70, seed=6)
    assert_close(ops.matmul(a, b), REF.matmul(a, b))


@pytest.mark.parametrize("group", [96, 24], ids=["row", "per-head"])
@pytest.mark.parametrize("rows", SEQS)
def test_rms_norm(ops, rows, group):
    x, w = rand(rows, 96, seed=rows, scale=3.0), rand(group, seed=7) + 1.0
    assert_close(ops.rms_norm(x, w, 1e-6), REF.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("rows", SEQS)
def test_apply_rope(ops, rows):
    head_dim = 32
    positions = np.arange(1000, 1000 + rows)  # far positions: large angles
    cos, sin = REF.rope_tables(positions, 1.0 / 10000 ** (np.arange(0, head_dim, 2) / head_dim))
    x = rand(rows, 3 * head_dim, seed=rows)
    assert_close(ops.apply_rope(x, cos, sin, head_dim), REF.apply_rope(x, cos, sin, head_dim))


@pytest.mark.parametrize("rows", SEQS)
def test_silu_mul(ops, rows):
    gate, up = rand(rows, 200, seed=rows, scale=6.0), rand(rows, 200, seed=rows + 1)
    gate[0, :4] = [-100.0, 100.0, 0.0, -87.5]  # beyond exp's range either way
    with np.errstate(over="ignore"):  # the reference's exp(100) is inf, and silu(-100) -0.0
        want = REF.silu_mul(gate, up)
    assert_close(ops.silu_mul(gate, up), want)


@pytest.mark.parametrize("rows", SEQS)
def test_softmax_rows_with_masked_scores(ops, rows):
    scores = REF.fill_strict_upper_tri(rand(rows, rows + 3, seed=rows, scale=4.0), -math.inf, offset=3)
    got = ops.softmax_rows(scores)
    assert_close(got, REF.softmax_rows(scores))
    assert np.all(got[np.isneginf(scores)] == 0.0)


@pytest.mark.parametrize("offset", [0, 3, -2])
@pytest.mark.parametrize("rows", [1, 64, 100])
def test_scale_and_mask_are_exact(ops, rows, offset):
    x = rand(rows, 70, seed=rows)
    assert np.array_equal(ops.scale(x, 0.125), REF.scale(x, 0.125))
    assert np.array_equal(ops.fill_strict_upper_tri(x, -math.inf, offset),
                          REF.fill_strict_upper_tri(x, -math.inf, offset))


# -- attention ------------------------------------------------------------------------------------
def qkv(seed, seq_q, seq_k, h, kv, hd):
    return rand(seq_q, h * hd, seed=seed), rand(seq_k, kv * hd, seed=seed + 1), rand(seq_k, kv * hd, seed=seed + 2)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"{g[0]}:{g[1]}x{g[2]}")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("seq", SEQS)
def test_flash_prefill(ops, seq, causal, geometry):
    h, kv, hd = geometry
    q, k, v = qkv(seq, seq, seq, h, kv, hd)
    assert_close(ops.flash_attention_prefill(q, k, v, h, kv, hd, causal),
                 REF.materialized_attention(q, k, v, h, kv, hd, causal))


@pytest.mark.parametrize("seq_q,seq_k", [(1, 64), (17, 100), (64, 65), (65, 200), (63, 127), (3, 200)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_prefill_query_offset(ops, seq_q, seq_k, causal):
    q, k, v = qkv(seq_k, seq_q, seq_k, 9, 3, 64)
    assert_close(ops.flash_attention_prefill(q, k, v, 9, 3, 64, causal),
                 REF.materialized_attention(q, k, v, 9, 3, 64, causal))


@pytest.mark.parametrize("seq_q,seq_k", [(767, 767), (769, 769), (500, 3071), (100, 3080)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_flash_prefill_taller_query_blocks(ops, seq_q, seq_k, causal):
    """Long prompts walk taller query blocks (attention.query_block): both sides of each switch."""
    q, k, v = qkv(seq_k, seq_q, seq_k, 4, 2, 32)
    assert_close(ops.flash_attention_prefill(q, k, v, 4, 2, 32, causal),
                 REF.materialized_attention(q, k, v, 4, 2, 32, causal))


@pytest.mark.parametrize("seq_q,seq_k,window", [(1000, 1000, 800), (3100, 3100, 3080),
                                                (3100, 3100, 100), (300, 3080, 1000)])
def test_flash_prefill_window_picks_query_blocks(ops, seq_q, seq_k, window):
    """With a window, a query block streams about window keys, and its height follows that."""
    q, k, v = qkv(window, seq_q, seq_k, 4, 2, 32)
    assert_close(ops.flash_attention_prefill(q, k, v, 4, 2, 32, True, window),
                 REF.materialized_attention(q, k, v, 4, 2, 32, True, window))


@pytest.mark.parametrize("window", [0, 1, 70, 500])
@pytest.mark.parametrize("kv_lens", [[1, 128, 129], [600, 64, 1000]])
def test_decode_attention_reads_only_its_keys(ops, kv_lens, window):
    """Slots 1, 3, 0 of four, float32 cache; every position a step must not read is NaN (past
    each length, older than the window, the unused slot), so reading one poisons the output.
    Long lengths make pool-eager cut the keys into several ranges."""
    slots, capacity, width = [1, 3, 0], 1040, 3 * 64
    rng = np.random.default_rng(len(kv_lens) + window)
    k_buf, v_buf = (np.full((4, capacity, width), np.nan, np.float32) for _ in range(2))
    q = rand(3, 9 * 64, seed=window)
    want = []
    for b, (slot, n) in enumerate(zip(slots, kv_lens)):
        first = max(0, n - window) if window else 0
        k, v = (rng.standard_normal((n - first, width), dtype=np.float32) for _ in range(2))
        k_buf[slot, first:n], v_buf[slot, first:n] = k, v
        want.append(REF.materialized_attention(q[b:b + 1], k, v, 9, 3, 64, True))
    got = ops.decode_attention(q, k_buf, v_buf, slots, kv_lens, 9, 3, 64, window)
    assert_close(got, np.concatenate(want))


def test_materialized_attention_on_own_ops(ops):
    """--flash off runs the backend's own matmul, scale, mask and softmax."""
    q, k, v = qkv(11, 70, 75, 9, 3, 64)
    assert_close(ops.materialized_attention(q, k, v, 9, 3, 64, True),
                 REF.materialized_attention(q, k, v, 9, 3, 64, True))


def test_causal_needs_enough_keys(ops):
    q, k, v = qkv(1, 10, 5, 4, 2, 16)
    with pytest.raises(ValueError, match="at least as many keys"):
        ops.flash_attention_prefill(q, k, v, 4, 2, 16, True)


# -- backend set-up -------------------------------------------------------------------------------
def test_weights_stay_out_in_and_read_only_ones_are_not_copied(ops):
    """A read-only float32 weight (a memory-mapped file's view) is multiplied where it lies."""
    w = rand(8, 5)
    w.flags.writeable = False
    stored = ops.weight(w)
    assert stored.shape == (8, 5) and stored.flags.c_contiguous and np.shares_memory(stored, w)
    for rows in (1, 3):
        x = rand(rows, 5, seed=rows)
        assert_close(ops.linear(x, stored), REF.linear(x, w))


def test_pool_threads_are_checked():
    import numba
    with pytest.raises(InfernoError, match="^threads must be between 1 and") as e:
        PoolBackend(threads=0)
    assert e.value.for_cli().startswith("--threads must be between 1 and")
    with pytest.raises(InfernoError, match="NUMBA_NUM_THREADS"):
        PoolBackend(threads=numba.config.NUMBA_NUM_THREADS + 1)
    with pytest.raises(InfernoError, match="only to: pool"):
        create_backend("simd", threads=2)
    one = create_backend("pool", threads=1)
    assert one.threads == 1
    one.close()


def test_blas_runs_one_thread_while_a_backend_lives():
    before = blas.thread_counts()
    if sys.platform.startswith("linux"):
        assert before, "no OpenBLAS found in this process"
    a, b = SimdBackend(), PoolBackend()
    assert all(n == 1 for n in blas.thread_counts())
    a.close()
    assert all(n == 1 for n in blas.thread_counts())  # b still needs one thread
    b.close()
    b.close()  # closing twice releases once
    assert blas.thread_counts() == before


CYTHON_BLAS_CHECK = """
import sys
import numpy as np
from inferno.backends.numba import blas, dense
blas.load_cython_blas()
assert "scipy.linalg" not in sys.modules, "scipy.linalg's package init ran"
a, b = np.random.default_rng(0).standard_normal((2, 40, 40), dtype=np.float32)
out = np.zeros((40, 40), np.float32)
dense.gemm_rows(a, b, out, 0, 40)  # Numba's np.dot, through the module loaded on its own
assert np.allclose(out, a @ b, atol=1e-4)
import scipy.linalg, scipy.linalg.cython_blas
assert scipy.linalg.cython_blas is sys.modules["scipy.linalg.cython_blas"]  # bound as usual
assert np.allclose(scipy.linalg.solve(np.eye(2), np.ones(2)), 1)
print("ok")
"""


def test_cython_blas_loads_without_scipy_linalg():
    """Numba's sgemm needs scipy.linalg.cython_blas only; blas loads it without scipy.linalg's
    package init (a tenth of a warm load) and scipy.linalg imported later still works."""
    run = subprocess.run([sys.executable, "-c", CYTHON_BLAS_CHECK], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


# -- whole models ---------------------------------------------------------------------------------
IDS = [5, 17, 200, 33, 1, 90, 91, 92, 7, 7, 7, 250, 3, 64, 128, 12, 99, 44, 21, 300] * 4  # 80 > a tile


@pytest.fixture(scope="module", params=["qwen3_dir", "llama_dir"])
def model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def cpu_engine(model_dir):
    with inferno.load(model_dir, backend="cpu", progress=False) as engine:
        yield engine


@pytest.mark.parametrize("variant", ["simd", "pool", "pool-eager"])
def test_logits_equal_cpu(model_dir, cpu_engine, variant):
    engine = inferno.load(model_dir, backend="simd" if variant == "simd" else "pool", progress=False)
    if variant == "pool-eager":
        engine.ops.parallel_min_elements = engine.ops.parallel_min_attention = 0
    with engine:
        want = cpu_engine.logits(IDS)
        assert_close(engine.logits(IDS), want, tol=2e-5)
        # and through the cache: a prefill, a chunk after it, then one token at a time
        model = engine.model
        cache = model.new_cache(len(IDS), cache_type="f32")  # f16 caches: test_parity.py
        pieces = [model.forward(IDS[:40], cache), model.forward(IDS[40:70], cache)]
        pieces += [model.forward([t], cache) for t in IDS[70:]]
        assert_close(np.concatenate(pieces), want, tol=2e-5)


def test_greedy_generation_same_tokens(model_dir):
    tokens = {}
    for backend in ["cpu", "simd", "pool"]:
        with inferno.load(model_dir, backend=backend, progress=False) as engine:
            result = engine.generate("Once upon a time", max_tokens=24, temperature=0, raw=True)
            tokens[backend] = result.token_ids
    assert len(tokens["cpu"]) > 0
    assert tokens["simd"] == tokens["cpu"] and tokens["pool"] == tokens["cpu"]
