"""Numba drivers for a mixture of experts' matrices: every chosen expert of a step in one call.

A step's rows arrive grouped by expert (base.ExpertPlan): group g is rows starts[g]..starts[g+1]
of x, and multiplies expert ids[g]'s rows of a stacked weight, rows ids[g] * n .. (ids[g] + 1) * n
(one contiguous run of blocks, read where it lies in the mapped file). Each group goes through
the kernel a dense linear of that many rows takes (dispatch.kernel): l_rows or lgemm's GEMM for a
legacy kind that takes int16 rows, dequantised tiles and sgemm for many float32 rows, and
otherwise qkernels.rows_kernel (which reads the same table). So a row's result is the one a
dense linear would give it: where the dense path is batch-invariant (the legacy kinds with int16
activations, the K-quants with int8), so are the experts. Q4_0, Q4_1 and MXFP4 experts may come
as panels of sixteen rows (the backends' experts_weight: lpanels.py), an expert's rows whole panels, which
the same table sends to lpanels.m_rows and lgemm's GEMM.

The activations are quantized once for all the step's rows, then sliced per group (every
quantity is per row). Jobs are (chunk of an expert's output rows, group), chunk-major: Numba
hands each thread an equal run of jobs, so with `chunks` equal to the threads each thread takes
its share of every expert's rows, whatever the groups' sizes. The gate and up matrices run
in the same job (they share the group's input), down in a second call on the gated product.
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np

from inferno.backends.numba import dispatch, jitcache, ldot, qgemm
from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.qkernels import (PASS_ROWS, activations, activations_par, chunk_start,
                                             legacy_gemm, legacy_rows, prefill_rows, quantized_par,
                                             rows_kernel)
from inferno.backends.numba.dispatch import F_TILES, L_GEMM, L_ROWS, int_dot

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)

NO_ROWS = np.empty((0, 0), np.uint8)  # the second weight of a call with one (and of linear_many's pads)
NO_ROWS.flags.writeable = False


def second_weight(w0, w1):
    """(kind, blocks) of a call's second weight: w1's, or none (NO_ROWS, of w0's kind, so the
    call compiles for one kind pair) when w0 goes alone."""
    return (WeightKind.of(w0), NO_ROWS) if w1 is None else (WeightKind.of(w1), w1.data)


# The plan's arithmetic keeps IEEE order (no fastmath): it is the reference's, op for op.
exact = nb.njit(cache=True, nogil=True)


@exact
def route(logits, top_k, norm_topk):
    """base.ExpertPlan.route and the plan's arrays in one call (a decode step's routing in
    numpy took ~100 us a layer, most of it per-call costs): the softmax in float32, the top_k
    (the lower expert first on a tie), renormalised if asked; then the assignments grouped by
    expert, a counting sort that keeps row order within a group as the stable argsort does.
    (weights, chosen, order, position, experts, starts)."""
    rows, n = logits.shape
    weights = np.empty((rows, top_k), np.float32)
    chosen = np.empty((rows, top_k), np.int64)
    p = np.empty(n, np.float32)
    for r in range(rows):
        top = logits[r].max()
        for e in range(n):
            p[e] = np.exp(logits[r, e] - top)
        p /= p.sum()
        best = np.argsort(-p, kind="mergesort")[:top_k]
        total = np.float32(0)
        for j in range(top_k):
            chosen[r, j] = best[j]
            weights[r, j] = p[best[j]]
            total += p[best[j]]
        if norm_topk:
            for j in range(top_k):
                weights[r, j] /= total
    counts = np.zeros(n, np.int64)
    for a in range(rows * top_k):
        counts[chosen[a // top_k, a % top_k]] += 1
    first = np.zeros(n + 1, np.int64)  # each expert's first group position
    for e in range(n):
        first[e + 1] = first[e] + counts[e]
    order = np.empty(rows * top_k, np.int64)
    position = np.empty((rows, top_k), np.int64)
    for a in range(rows * top_k):
        e = chosen[a // top_k, a % top_k]
        order[first[e]] = a
        position[a // top_k, a % top_k] = first[e]
        first[e] += 1
    used = np.flatnonzero(counts)
    starts = np.zeros(used.size + 1, np.int64)
    for g in range(used.size):
        starts[g + 1] = starts[g] + counts[used[g]]
    return weights, chosen, order, position, used, starts


@exact
def combine(y, weights, position):
    """base.ExpertPlan.combine: each row's choices weighted and added in rank order."""
    rows, top_k = weights.shape
    out = np.empty((rows, y.shape[1]), np.float32)
    for r in range(rows):
        for c in range(y.shape[1]):
            out[r, c] = weights[r, 0] * y[position[r, 0], c]
        for j in range(1, top_k):
            for c in range(y.shape[1]):
                out[r, c] += weights[r, j] * y[position[r, j], c]
    return out


@jit
def _rows_of(xq, a, b):
    """Rows a..b of quantized activations (arrays of no rows stay so)."""
    return xq[0][a:b], xq[1][a:b], xq[2][a:b], xq[3][a:b], xq[4][a:b]


@jit
def _no_int16():
    """The int16 activations of a call that takes none (ldot.quantized's shape, no rows)."""
    return np.empty((0, 0), np.int16), np.empty((0, 0), np.float32), np.empty((0, 0), np.float32)


@jit
def _part(kind, w, x, xs, xq, lx, out, c, chunks, tile):
    """Chunk c of `chunks` of out = x @ w.T, w one expert's rows; `lx` x as int16 rows (no rows
    where the legacy kinds take float32)."""
    rows = w.shape[0]
    way = dispatch.kernel(kind, x.shape[0], x.shape[1], 1 if xq[0].shape[0] > 0 else 0, lx[0].shape[0] > 0)
    if way == L_ROWS:
        r0, r1 = chunk_start(rows, c, chunks, 8), chunk_start(rows, c + 1, chunks, 8)
        if r0 < r1:
            legacy_rows(kind, w, lx[0], lx[1], lx[2], out, r0, r1)
        return
    if way == L_GEMM:
        r0, r1 = chunk_start(rows, c, chunks, PASS_ROWS), chunk_start(rows, c + 1, chunks, PASS_ROWS)
        if r0 < r1:
            legacy_gemm(kind, w, lx[0], lx[1], lx[2], out, r0, r1)
        return
    r0, r1 = chunk_start(rows, c, chunks, qgemm.ROWS), chunk_start(rows, c + 1, chunks, qgemm.ROWS)
    if r0 >= r1:
        return
    if way == F_TILES:
        scratch = np.empty(tile * x.shape[1] + x.shape[0] * tile, np.float32)
        prefill_rows(kind, w, x, out, r0, r1, tile, scratch)
    else:
        rows_kernel(kind, way, w, x, xs, xq, out, np.int64(0), r0, r1)


@jit
def _job(k0, k1, w0, w1, x, xs, xq, lx, out0, out1, starts, ids, job, chunks, tile):
    """Job (chunk, group): the chunk of group g's rows times its expert, in w0 and (when it has
    rows) w1."""
    groups = ids.shape[0]
    c, g = job // groups, job % groups
    a, b = starts[g], starts[g + 1]
    n0, n1, e = out0.shape[1], out1.shape[1], ids[g]
    xg, xsg, xqg = x[a:b], xs[a:b], _rows_of(xq, a, b)
    lxg = (lx[0][a:b], lx[1][a:b], lx[2][a:b])
    _part(k0, w0[e * n0:(e + 1) * n0], xg, xsg, xqg, lxg, out0[a:b], c, chunks, tile)
    if n1 > 0:
        _part(k1, w1[e * n1:(e + 1) * n1], xg, xsg, xqg, lxg, out1[a:b], c, chunks, tile)


@jit
def _int16(k0, k1, legacy):
    """Whether the call takes x as int16 rows: a legacy kind, where the backend says so."""
    return legacy and (ldot.legacy(k0) or ldot.legacy(k1))


@jit
def _inputs(k0, k1, x, mode, legacy):
    xs = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    xq = activations(x, xs, mode if int_dot(k0) or int_dot(k1) else np.int64(0))
    return xs, xq, ldot.quantized(x) if _int16(k0, k1, legacy) else _no_int16()


@jit
def experts(k0, k1, w0, w1, x, out0, out1, starts, ids, tile, mode, legacy):
    """out0 = each group of x times its expert's rows of w0 [n_expert * n0, cols], and out1 of w1
    (a weight of no rows, and out1 of no columns, for one matrix alone); on this thread.
    `legacy`: the legacy kinds take x as int16 rows (the backend's int16_legacy)."""
    xs, xq, lx = _inputs(k0, k1, x, mode, legacy)
    for job in range(ids.shape[0]):
        _job(k0, k1, w0, w1, x, xs, xq, lx, out0, out1, starts, ids, job, np.int64(1), tile)


@nb.njit(parallel=True, cache=True, fastmath=FAST)
def experts_par(k0, k1, w0, w1, x, out0, out1, starts, ids, tile, chunks, mode, legacy):
    """`experts`, each expert's rows cut into `chunks`, all the jobs in one launch."""
    xs, xq = activations_par(x, mode if int_dot(k0) or int_dot(k1) else np.int64(0), chunks)
    lx = quantized_par(x, chunks) if _int16(k0, k1, legacy) else _no_int16()
    for job in nb.prange(ids.shape[0] * chunks):
        # (np.int64: a prange's index is unsigned inside the parallel region, signed where Numba
        # first types the loop; the callee would compile for both)
        _job(k0, k1, w0, w1, x, xs, xq, lx, out0, out1, starts, ids, np.int64(job), chunks, tile)


@functools.cache
def experts_for(k0: WeightKind, k1: WeightKind):
    """`experts` for two kinds: (w0, w1, x, out0, out1, starts, ids, tile, mode, legacy)."""
    k0, k1 = int(WeightKind(k0)), int(WeightKind(k1))  # the closure's literals

    @jit
    def experts_kinds(w0, w1, x, out0, out1, starts, ids, tile, mode, legacy):
        experts(k0, k1, w0, w1, x, out0, out1, starts, ids, tile, mode, legacy)
    return jitcache.lazy(experts_kinds)


@functools.cache
def experts_par_for(k0: WeightKind, k1: WeightKind):
    """`experts_par` for two kinds: (w0, w1, x, out0, out1, starts, ids, tile, chunks, mode,
    legacy)."""
    k0, k1 = int(WeightKind(k0)), int(WeightKind(k1))

    @jit
    def experts_par_kinds(w0, w1, x, out0, out1, starts, ids, tile, chunks, mode, legacy):
        experts_par(k0, k1, w0, w1, x, out0, out1, starts, ids, tile, chunks, mode, legacy)
    return jitcache.lazy(experts_par_kinds)
