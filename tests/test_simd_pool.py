"""What is particular to the simd and pool backends: their exp, weights kept where they lie, the
pool's thread count, BLAS on one thread, scipy's BLAS loaded on its own; then whole models:
logits equal cpu's within float32 rounding, greedy generation gives the same tokens. Each op
against the reference, on these backends and the others: tests/ops/.

"pool-eager" is the pool with its size thresholds at zero, so every op, however small, runs as a
parallel launch (at the default thresholds small test shapes would take the serial path), and
its decode cuts each sequence's keys into ranges of 16 or more, so the split-and-merge path runs;
"pool-1" is the pool on one thread.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from ops.helpers import assert_close, rand

import inferno
from inferno.backends.numba import blas
from inferno.backends import create_backend
from inferno.backends.numba import dense as K
from inferno.backends.cpu import CpuBackend
from inferno.backends.numba.pool import PoolBackend
from inferno.backends.numba.simd import SimdBackend
from inferno.errors import InfernoError

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


def test_every_path_reaches_the_parallel_kernels_of_long_prompts(monkeypatch):
    """The warm-up's every_path: a few rows take the launches a long prompt's do, here the int16
    rows of a legacy kind's activations made across the team (a 3,000-token prompt on Gemma 3
    compiled them after a warm-up without it); the same rows as the serial kernel's."""
    from inferno.backends.numba import qkernels as Q
    pool = PoolBackend(threads=2)
    launched = []
    launch = pool._launch
    monkeypatch.setattr(pool, "_launch", lambda f, *a: (launched.append(f), launch(f, *a))[1])
    x = rand(3, 96, seed=5)
    alone = pool._quantized(x)
    assert Q.quantized_par not in launched  # 3 rows: on the calling thread
    with pool.every_path():
        together = pool._quantized(x)
    assert Q.quantized_par in launched and pool.par_activations == Q.PAR_ACTIVATIONS
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(a, b)


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
