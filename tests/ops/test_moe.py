"""moe: a mixture-of-experts SwiGLU MLP, experts stacked by rows ([n_expert * inter, hidden] gate
and up, [n_expert * hidden, inter] down), a router [n_expert, hidden].

Pinned to the textbook, token by token in float64: softmax over every expert's logit, the top_k
largest, renormalised over them when asked, and the sum of each chosen expert's
down(silu(gate x) * up x) times its weight. Float32 and 16-bit experts agree within float32
rounding; K-quant experts with int8 activations and legacy-kind experts with int16 ones (simd,
pool) are pinned instead to the reference's own loop over experts run through the same
backend's linear (which test_linear pins to the dequantised product): the fast path must be
those same kernels, row for row, so the two agree to rounding, and a row's output does not
depend on the rows beside it (decode, a few rows, qgemm's panels at 32 rows and more a group;
for the legacy kinds, l_rows and lgemm, bit for bit).
"""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import NUMBA, assert_close, f32, host, rand
from qblocks import random_blocks

from inferno.backends.base import Backend
from inferno.formats.quant import QuantTensor

GPU = False


def textbook(x, router, gate, up, down, top_k, norm_topk, biases=None, clamp=None):
    """The MLP of each row of x on its own, in float64; gpt-oss's biases (router, gate, up,
    down) and clamped SwiGLU as transformers' GptOssExperts has them."""
    as64 = lambda w: (w.dequantize() if isinstance(w, QuantTensor) else np.asarray(w)).astype(np.float64)  # noqa: E731
    r, g, u, d = as64(router), as64(gate), as64(up), as64(down)
    n = r.shape[0]
    inter, hidden = g.shape[0] // n, d.shape[0] // n
    out = np.zeros((x.shape[0], hidden))
    for i, row in enumerate(x.astype(np.float64)):
        logits = r @ row + (0 if biases is None else biases[0][0])
        p = np.exp(logits - logits.max())
        p /= p.sum()
        chosen = np.argsort(-p, kind="stable")[:top_k]
        weights = p[chosen] / (p[chosen].sum() if norm_topk else 1.0)
        for e, wt in zip(chosen, weights):
            a = g[e * inter:(e + 1) * inter] @ row
            b = u[e * inter:(e + 1) * inter] @ row
            if biases is not None:
                a, b = a + biases[1][e], b + biases[2][e]
            if clamp is None:
                h = a / (1 + np.exp(-a)) * b
            else:
                alpha, limit = clamp
                a, b = np.minimum(a, limit), np.clip(b, -limit, limit)
                h = (b + 1) * a / (1 + np.exp(-alpha * a))
            out[i] += wt * (d[e * hidden:(e + 1) * hidden] @ h + (0 if biases is None else biases[3][e]))
    return out


def experts(n, hidden, inter, seed, name=None):
    """Stacked gate, up, down: float32 (name None) or random blocks of `name`."""
    if name is None:
        return (rand(n * inter, hidden, seed=seed, scale=0.2), rand(n * inter, hidden, seed=seed + 1, scale=0.2),
                rand(n * hidden, inter, seed=seed + 2, scale=0.2))
    ws = [random_blocks(name, n * inter, hidden, seed=seed, extremes=False, readonly=True),
          random_blocks(name, n * inter, hidden, seed=seed + 1, extremes=False, readonly=True),
          random_blocks(name, n * hidden, inter, seed=seed + 2, extremes=False, readonly=True)]
    ws[2].outlier_inputs = True  # as the decoder marks down_proj
    return ws


def moe(backend, x, router, ws, top_k, norm_topk, biases=None, clamp=None):
    extra = {} if biases is None else dict(biases=[backend.from_numpy(b) for b in biases], clamp=clamp)
    return host(backend, backend.moe(backend.from_numpy(x), backend.weight(router),
                                     [backend.weight(w) for w in ws], top_k, norm_topk, **extra))


@pytest.mark.parametrize("rows", [1, 3, 17, 40])
@pytest.mark.parametrize("n,top_k,norm_topk", [(4, 2, True), (8, 2, False), (8, 1, True), (3, 3, False)])
def test_moe_matches_the_textbook(backend, rows, n, top_k, norm_topk):
    hidden, inter = 64, 96
    router, ws = rand(n, hidden, seed=7), experts(n, hidden, inter, seed=rows)
    x = rand(rows, hidden, seed=rows + 100)
    got = moe(backend, x, router, ws, top_k, norm_topk)
    assert_close(got, f32(textbook(x, router, *ws, top_k, norm_topk)), tol=1e-5)


@pytest.mark.parametrize("name", ["F16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"])
@pytest.mark.parametrize("rows", [1, 5, 70])
def test_moe_on_quantized_experts(backend, name, rows):
    """Float32 activations within rounding of the textbook; int8 ones (simd, pool's K-quants)
    and int16 ones (their legacy kinds) the reference's loop over experts through this
    backend's own linear, to rounding."""
    n, hidden, inter = 4, 256, 512
    router, ws = rand(n, hidden, seed=3), experts(n, hidden, inter, seed=11, name=name)
    x = rand(rows, hidden, seed=rows, scale=0.01)  # random blocks' weights run to tens
    got = moe(backend, x, router, ws, 2, True)
    if (getattr(backend, "int8_activations", False) and name in ("Q4_K", "Q5_K", "Q6_K")
            or getattr(backend, "_legacy", False) and name in ("Q8_0", "Q4_0", "MXFP4")):
        want = host(backend, Backend.moe(backend, backend.from_numpy(x), router,
                                         [backend.weight(w) for w in ws], 2, True))
        assert_close(got, want, tol=1e-5)
    else:
        want = f32(textbook(x, router, *ws, 2, True))
        assert_close(got, want, tol=2e-5)


@pytest.mark.parametrize("name", [None, "Q8_0", "Q4_K"])
@pytest.mark.parametrize("rows", [1, 9])
def test_gpt_oss_biases_and_clamped_swiglu(backend, name, rows):
    """gpt-oss's experts: a bias on the router and on each expert's gate, up and down, and
    (up + 1) * g * sigmoid(1.702 g) with the gate clamped to at most 7 and up to +-7, inputs
    large enough that both clamps bite."""
    n, hidden, inter = 4, 256, 256  # rows of whole K-quant super-blocks
    router, ws = rand(n, hidden, seed=13), experts(n, hidden, inter, seed=31, name=name)
    biases = [rand(1, n, seed=41), rand(n, inter, seed=42, scale=3.0), rand(n, inter, seed=43, scale=3.0),
              rand(n, hidden, seed=44)]
    x = rand(rows, hidden, seed=rows, scale=0.5 if name is None else 0.02)
    got = moe(backend, x, router, ws, 2, True, biases, (1.702, 7.0))
    if name == "Q4_K" and getattr(backend, "int8_activations", False) or name == "Q8_0" and getattr(backend, "_legacy", False):
        want = host(backend, Backend.moe(backend, backend.from_numpy(x), router, [backend.weight(w) for w in ws],
                                         2, True, [backend.from_numpy(b) for b in biases], (1.702, 7.0)))
        assert_close(got, want, tol=1e-5)
    else:
        assert_close(got, f32(textbook(x, router, *ws, 2, True, biases, (1.702, 7.0))), tol=2e-5)


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q4_1", "MXFP4"])
def test_a_rows_output_does_not_depend_on_its_batch(backend, name):
    """Each row alone (decode), and among 80 (two experts: 80 rows a group; gate and up, rows
    of 1024, on qgemm's panels, down on k_few). The legacy kinds, taken as int16, give the
    same bits (l_rows alone, lgemm among many), as a dense linear of theirs does."""
    n, hidden, inter = 2, 1024, 256
    router, ws = rand(n, hidden, seed=5), experts(n, hidden, inter, seed=21, name=name)
    exact = backend._legacy and name in ("Q8_0", "Q4_1", "MXFP4")
    if exact:  # a router of a legacy kind too: a float32 one's product is not batch-invariant
        router = random_blocks("Q8_0", n, hidden, seed=5, extremes=False, readonly=True)
    x = rand(80, hidden, seed=9, scale=0.01)
    together = moe(backend, x, router, ws, 2, True)
    for i in (0, 37, 79):
        alone = moe(backend, x[i:i + 1], router, ws, 2, True)
        # float32 order only, but over sums that cancel (random blocks: terms of 1e4, results of
        # 1e2), so relative to the output's scale the bound is looser than elsewhere
        assert_close(alone[0], together[i], tol=1e-4)
        if exact:
            assert np.array_equal(alone[0], together[i])


def test_moe_refuses_experts_that_do_not_fit_the_router(backend):
    hidden, inter = 64, 96
    gate, up, down = experts(4, hidden, inter, seed=1)
    x = rand(2, hidden, seed=2)
    with pytest.raises(ValueError, match="top_k"):
        moe(backend, x, rand(4, hidden, seed=3), (gate, up, down), 5, True)
    with pytest.raises(ValueError, match="experts"):
        moe(backend, x, rand(3, hidden, seed=3), (gate, up, down), 2, True)  # 4 experts, 3 scores
