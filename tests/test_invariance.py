"""Batch invariance on the Numba backends (issue 41): a row's result is the same bit for bit
whatever rows share its step. Float weights' products sum in one order (fdot.py: one kernel for
any rows), the legacy kinds' too (one row, a few, a prefill's GEMM), and so do the K-quants'
(qdot.k_tail: one row, a few, qgemm's and kpanels' panels); attention reads every row of a cached step as decode does. So a prompt's logits do
not depend on how it was cut into chunks, how much of it a cache held, what it was batched with,
or how many threads ran it."""

from __future__ import annotations

import numpy as np
import pytest

import inferno
from inferno.backends import create_backend
from inferno.backends.numba import kpanels, lpanels
from inferno.model.decoder import Segment
from inferno.loading.resolve import resolve
from tests.qblocks import random_blocks

LEGACY = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "Q4_0X16", "Q4_1X16", "MXFP4X16"]
K_QUANTS = ["Q4_K", "Q5_K", "Q6_K", "Q4_KX8"]


def _legacy_backends():
    simd, pool = create_backend("simd"), create_backend("pool", threads=2)
    if not simd._legacy:
        pytest.skip("this CPU takes the legacy kinds' activations in float32 (no AVX2, or AVX-512 "
                    "without VNNI): their paths are not batch-invariant there")
    return simd, pool


def _legacy_weight(kind, rows, cols, seed):
    """Random blocks of a legacy kind; Q4_0X16, Q4_1X16, MXFP4X16: in panels (lpanels.py), rows
    rounded up to whole panels."""
    if kind.endswith("X16"):
        return lpanels.repack(random_blocks(kind[:-3], rows + -rows % lpanels.P, cols, seed=seed))
    return random_blocks(kind, rows, cols, seed=seed)


@pytest.mark.parametrize("kind", LEGACY)
def test_a_rows_product_does_not_depend_on_its_company(kind):
    """linear on B rows equals, bit for bit, each row alone, for every path a row count takes
    (one row, a few, lgemm's GEMM), on one thread and on two; rows of a weight not a multiple of
    eight or of lgemm's passes included (of sixteen and thirty-two for MXFP4 in panels)."""
    simd, pool = _legacy_backends()
    rng = np.random.default_rng(1)
    for rows, cols in ((203, 96), (64, 256)):
        w = _legacy_weight(kind, rows, cols, seed=rows)
        x = (rng.standard_normal((40, cols)) * rng.choice([0.01, 1, 30], (40, 1))).astype(np.float32)
        alone = np.concatenate([simd.linear(x[i:i + 1], w) for i in range(40)])
        for ops in (simd, pool):
            for b in (1, 2, 3, 4, 9, 17, 40):
                np.testing.assert_array_equal(ops.linear(x[:b], w), alone[:b], err_msg=f"{ops.name}, {b} rows")
        wide = [_legacy_weight(kind, 96, cols, seed=7), w]
        for b in (1, 3, 5, 40):  # q/k/v and gate/up: one launch, or the rows rounded once
            for got, one in zip(pool.linear_many(x[:b], wide), (simd.linear(x[:b], v) for v in wide)):
                np.testing.assert_array_equal(got, one)
    simd.close()
    pool.close()


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_a_float_rows_product_does_not_depend_on_its_company(kind):
    """As above for float weights (fdot.f_rows: one row, the rows left over from blocks of four,
    a prefill's tiles), float32 matrices of a width not a multiple of sixteen included, where
    the last columns are added one by one; and against float64 arithmetic, as a product."""
    simd, pool = create_backend("simd"), create_backend("pool", threads=2)
    rng = np.random.default_rng(3)
    shapes = ((203, 96), (64, 256), (37, 100)) if kind == "F32" else ((203, 96), (64, 256))
    for rows, cols in shapes:
        if kind == "F32":
            w = simd.weight(rng.standard_normal((rows, cols)).astype(np.float32))
            exact = np.asarray(w, np.float64)
        else:
            w = random_blocks(kind, rows, cols, seed=rows)
            exact = w.dequantize(0, rows).astype(np.float64)
        x = (rng.standard_normal((40, cols)) * rng.choice([0.01, 1, 30], (40, 1))).astype(np.float32)
        alone = np.concatenate([simd.linear(x[i:i + 1], w) for i in range(40)])
        np.testing.assert_allclose(alone, x.astype(np.float64) @ exact.T, rtol=1e-4, atol=1e-3 * np.abs(x).max())
        for ops in (simd, pool):
            for b in (1, 2, 3, 4, 5, 9, 17, 40):
                np.testing.assert_array_equal(ops.linear(x[:b], w), alone[:b], err_msg=f"{ops.name}, {b} rows")
        if kind != "F32":
            wide = [random_blocks(kind, 48, cols, seed=7), w]
            for b in (1, 3, 5, 16):  # q/k/v and gate/up in one launch
                for got, one in zip(pool.linear_many(x[:b], wide), (simd.linear(x[:b], v) for v in wide)):
                    np.testing.assert_array_equal(got, one)
    simd.close()
    pool.close()


@pytest.mark.parametrize("outliers", [False, True], ids=["one-int8-row", "remainder-row"])
@pytest.mark.parametrize("kind", K_QUANTS)
def test_a_k_quant_rows_product_does_not_depend_on_its_company(kind, outliers):
    """As above for the K-quants with int8 activations, with and without the remainder row:
    one row (qdot.k_rows), a few (k_few, four a pass), a prefill's panels (qgemm.k_gemm), and
    Q4_K stored as panels (kpanels.p_rows, p_gemm; Q4_KX8), at widths of 512 and 1024 (both
    sides of GEMM_MIN_COLS where VNNI is 256 bits wide); weight rows not a multiple of a
    panel's sixteen included."""
    simd, pool = create_backend("simd"), create_backend("pool", threads=2)
    if not simd.int8_activations:
        pytest.skip("this CPU takes the K-quants' activations in float32 (no AVX2)")
    rng = np.random.default_rng(2)
    for rows, cols in ((200, 512), (72, 1024)):
        w = random_blocks(kind.replace("X8", ""), rows, cols, seed=rows)
        w.outlier_inputs = outliers
        if kind == "Q4_KX8":
            w = kpanels.repack(w)
        x = (rng.standard_normal((40, cols)) * rng.choice([0.01, 1, 30], (40, 1))).astype(np.float32)
        alone = np.concatenate([simd.linear(x[i:i + 1], w) for i in range(40)])
        for ops in (simd, pool):
            for b in (1, 2, 3, 4, 5, 9, 16, 17, 40):
                np.testing.assert_array_equal(ops.linear(x[:b], w), alone[:b], err_msg=f"{ops.name}, {b} rows")
        wide = [random_blocks("Q6_K", 48, cols, seed=7), w]
        wide[0].outlier_inputs = outliers  # weights fused in one launch share their input
        for b in (1, 3, 5, 40):
            for got, one in zip(pool.linear_many(x[:b], wide), (simd.linear(x[:b], v) for v in wide)):
                np.testing.assert_array_equal(got, one)
    simd.close()
    pool.close()


def test_decode_attention_rows_do_not_depend_on_their_company():
    """Each row of a decode step attends alike alone, beside others, on one thread or two, and
    with keys enough to be cut into ranges (kv_kernels.row_splits)."""
    simd, pool = create_backend("simd"), create_backend("pool", threads=2)
    rng = np.random.default_rng(2)
    heads, kv_heads, hd, cap = 4, 2, 64, 700
    k = simd.kv_buffer(2, cap, kv_heads * hd, "f16")
    v = simd.kv_buffer(2, cap, kv_heads * hd, "f16")
    for slot in range(2):
        simd.write_kv(k, slot, 0, rng.standard_normal((cap, kv_heads * hd)).astype(np.float32))
        simd.write_kv(v, slot, 0, rng.standard_normal((cap, kv_heads * hd)).astype(np.float32))
    q = rng.standard_normal((6, heads * hd)).astype(np.float32)
    slots = np.array([0, 1, 0, 0, 1, 0])
    lens = np.array([5, 300, 511, 512, 700, 699])
    alone = np.concatenate([simd.decode_attention(q[i:i + 1], k, v, slots[i:i + 1], lens[i:i + 1], heads, kv_heads, hd)
                            for i in range(6)])
    for ops in (simd, pool):
        np.testing.assert_array_equal(ops.decode_attention(q, k, v, slots, lens, heads, kv_heads, hd), alone)
        for window in (0, 100):
            one = [ops.decode_attention(q[i:i + 1], k, v, slots[i:i + 1], lens[i:i + 1], heads, kv_heads, hd,
                                        window=window) for i in range(6)]
            np.testing.assert_array_equal(ops.decode_attention(q, k, v, slots, lens, heads, kv_heads, hd,
                                                               window=window), np.concatenate(one))
    simd.close()
    pool.close()


@pytest.fixture(scope="module")
def smollm2_pool():
    engine = inferno.load(str(resolve("smollm2-135m")), "pool", threads=2, progress=False)
    yield engine
    engine.close()


def _assert_cut_invariant(engine, ids, mid):
    """A prompt's last logits prefilled whole equal, bit for bit, those after a cache of 1, mid
    or n - 1 of its tokens, in three uneven chunks, and beside another sequence's prefill and
    decode."""
    model, ops, n = engine.model, engine.ops, ids.size

    def last_logits(cuts, other=None):
        cache = model.new_cache(n + 8, slots=2)
        for a, b in zip(cuts[:-1], cuts[1:]):
            segments = [Segment(ids[a:b], 0, a)]
            if other is not None:
                segments.append(Segment(other, 1, int(cache.lengths[1])))
                other = other[-1:]  # its prompt, then one token a step
            out = ops.to_numpy(model.step(segments, cache))[0]
        return out

    whole = last_logits([0, n])
    for cuts in ([0, 1, n], [0, mid, n], [0, n - 1, n], [0, mid // 3, mid + 1, n]):
        np.testing.assert_array_equal(last_logits(cuts).view(np.uint32), whole.view(np.uint32), err_msg=str(cuts))
    companion = last_logits([0, mid, n - 1, n], other=ids[:9][::-1].copy())
    np.testing.assert_array_equal(companion.view(np.uint32), whole.view(np.uint32))


def test_a_prompts_logits_do_not_depend_on_the_cache_or_the_batch(smollm2_pool):
    """The default model on the default backend (the issue's prefix-cache hits of 24 and 40
    tokens moved logprobs by 0.013 and flipped a greedy choice)."""
    if not smollm2_pool.ops._legacy:
        pytest.skip("this CPU takes the legacy kinds' activations in float32: not batch-invariant")
    ids = smollm2_pool.encode_prompt("List three fruits as JSON, and say why each is a fruit.")
    _assert_cut_invariant(smollm2_pool, np.asarray(ids, np.int64), 24)


def test_a_k_quant_models_logits_do_not_depend_on_the_cache_or_the_batch():
    """The same for Gemma 3 270M Q4_K_M (Q4_K, Q6_K, Q5_0 and Q8_0 weights, sliding windows) on
    pool."""
    engine = inferno.load(str(resolve("gemma3-270m")), "pool", threads=2, progress=False)
    try:
        if not engine.ops.int8_activations or not engine.ops._legacy:
            pytest.skip("this CPU takes the K-quants' or the legacy kinds' activations in float32 "
                        "(Gemma's Q5_0 and Q8_0 matrices): not batch-invariant")
        ids = engine.tokenizer.encode("The chemical symbol for gold is Au, and for silver it is")
        _assert_cut_invariant(engine, np.asarray(ids, np.int64), 5)
    finally:
        engine.close()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_float_models_logits_do_not_depend_on_the_cache_or_the_batch(tmp_path, dtype):
    """The same for a Hugging Face folder of float32 or bfloat16 weights (fdot.py) on pool:
    wider than sixteen columns, with a width that is not (intermediate 100)."""
    from tests.tiny import make_model

    folder = make_model(tmp_path / dtype, "qwen3", hidden=96, intermediate=100, dtype=dtype)
    engine = inferno.load(str(folder), "pool", threads=2, progress=False)
    try:
        ids = np.asarray(engine.tokenizer.encode("a b c d e f g h i j k l m n o p"), np.int64)
        _assert_cut_invariant(engine, ids, 7)
    finally:
        engine.close()


def test_the_lane_sums_of_many_rows_are_each_rows_own():
    """lanes.vsums_exact (the blocked float kernels) sums each vector's lanes as vsum_exact
    (fdot's tree) does, bit for bit, for 2, 4, 8 and 16 vectors, compiled with the kernels'
    fast-math flags (which must not regroup them), on sums whose order shows in their bits."""
    import numba as nb

    from inferno.backends.numba.dense import FAST
    from inferno.backends.numba.lanes import vload, vstore, vsum_exact, vsums_exact

    @nb.njit(fastmath=FAST)
    def both(x, k, out, each):
        v0, v1, v2, v3 = vload(x, 0), vload(x, 16), vload(x, 32), vload(x, 48)
        v4, v5, v6, v7 = vload(x, 64), vload(x, 80), vload(x, 96), vload(x, 112)
        v8, v9, v10, v11 = vload(x, 128), vload(x, 144), vload(x, 160), vload(x, 176)
        v12, v13, v14, v15 = vload(x, 192), vload(x, 208), vload(x, 224), vload(x, 240)
        if k == 2:
            vstore(out, 0, vsums_exact((v0, v1)))
        elif k == 4:
            vstore(out, 0, vsums_exact((v0, v1, v2, v3)))
        elif k == 8:
            vstore(out, 0, vsums_exact((v0, v1, v2, v3, v4, v5, v6, v7)))
        else:
            vstore(out, 0, vsums_exact((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15)))
        for i, v in enumerate((v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15)):
            each[i] = vsum_exact(v)

    rng = np.random.default_rng(7)
    for _ in range(50):
        x = (rng.standard_normal(256) * 10.0 ** rng.integers(-6, 7, 256)).astype(np.float32)
        for k in (2, 4, 8, 16):
            out, each = np.zeros(16, np.float32), np.zeros(16, np.float32)
            both(x, k, out, each)
            np.testing.assert_array_equal(out[:k].view(np.uint32), each[:k].view(np.uint32))
