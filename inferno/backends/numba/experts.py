"""Numba drivers for a mixture of experts' matrices: every chosen expert of a step in one call.

A step's rows arrive grouped by expert (base.ExpertPlan): group g is rows starts[g]..starts[g+1]
of x, and multiplies expert ids[g]'s rows of a stacked weight, rows ids[g] * n .. (ids[g] + 1) * n
(one contiguous run of blocks, read where it lies in the mapped file). Each group goes through
the kernels a dense linear of that many rows takes (qkernels.rows_kernel: decode rows, a few
rows or qgemm's panels; sgemm on dequantised tiles for many rows of a kind without int8
products), so a row's result is the one a dense linear would give it: the batch invariance of
the dense path holds for experts too.

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

from inferno.backends.numba import jitcache, qgemm
from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.qkernels import (FEW_MAX, activations, chunk_start, int_dot, prefill_rows,
                                             rows_kernel)

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)

NO_ROWS = np.empty((0, 0), np.uint8)  # the second weight of a call with one (and of linear_many's pads)
NO_ROWS.flags.writeable = False


@jit
def _rows_of(xq, a, b):
    """Rows a..b of quantized activations (arrays of no rows stay so)."""
    return xq[0][a:b], xq[1][a:b], xq[2][a:b], xq[3][a:b], xq[4][a:b]


@jit
def _part(kind, w, x, xs, xq, out, c, chunks, tile):
    """Chunk c of `chunks` of out = x @ w.T, w one expert's rows."""
    rows = w.shape[0]
    r0, r1 = chunk_start(rows, c, chunks, 2 * qgemm.P), chunk_start(rows, c + 1, chunks, 2 * qgemm.P)
    if r0 >= r1:
        return
    if x.shape[0] > FEW_MAX and not (int_dot(kind) and xq[0].shape[0] > 0):
        scratch = np.empty(tile * x.shape[1] + x.shape[0] * tile, np.float32)
        prefill_rows(kind, w, x, out, r0, r1, tile, scratch)
    else:
        rows_kernel(kind, w, x, xs, xq, out, 0, r0, r1)


@jit
def _job(k0, k1, w0, w1, x, xs, xq, out0, out1, starts, ids, job, chunks, tile):
    """Job (chunk, group): the chunk of group g's rows times its expert, in w0 and (when it has
    rows) w1."""
    groups = ids.shape[0]
    c, g = job // groups, job % groups
    a, b = starts[g], starts[g + 1]
    n0, n1, e = out0.shape[1], out1.shape[1], ids[g]
    xg, xsg, xqg = x[a:b], xs[a:b], _rows_of(xq, a, b)
    _part(k0, w0[e * n0:(e + 1) * n0], xg, xsg, xqg, out0[a:b], c, chunks, tile)
    if n1 > 0:
        _part(k1, w1[e * n1:(e + 1) * n1], xg, xsg, xqg, out1[a:b], c, chunks, tile)


@jit
def _inputs(k0, k1, x, mode):
    xs = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    return xs, activations(x, xs, mode if int_dot(k0) or int_dot(k1) else 0)


@jit
def experts(k0, k1, w0, w1, x, out0, out1, starts, ids, tile, mode):
    """out0 = each group of x times its expert's rows of w0 [n_expert * n0, cols], and out1 of w1
    (a weight of no rows, and out1 of no columns, for one matrix alone); on this thread."""
    xs, xq = _inputs(k0, k1, x, mode)
    for job in range(ids.shape[0]):
        _job(k0, k1, w0, w1, x, xs, xq, out0, out1, starts, ids, job, 1, tile)


@nb.njit(parallel=True, cache=True, fastmath=FAST)
def experts_par(k0, k1, w0, w1, x, out0, out1, starts, ids, tile, chunks, mode):
    """`experts`, each expert's rows cut into `chunks`, all the jobs in one launch."""
    xs, xq = _inputs(k0, k1, x, mode)
    for job in nb.prange(ids.shape[0] * chunks):
        _job(k0, k1, w0, w1, x, xs, xq, out0, out1, starts, ids, job, chunks, tile)


@functools.cache
def experts_for(k0: WeightKind, k1: WeightKind):
    """`experts` for two kinds: (w0, w1, x, out0, out1, starts, ids, tile, mode)."""
    k0, k1 = int(WeightKind(k0)), int(WeightKind(k1))  # the closure's literals

    @jit
    def experts_kinds(w0, w1, x, out0, out1, starts, ids, tile, mode):
        experts(k0, k1, w0, w1, x, out0, out1, starts, ids, tile, mode)
    return jitcache.lazy(experts_kinds)


@functools.cache
def experts_par_for(k0: WeightKind, k1: WeightKind):
    """`experts_par` for two kinds: (w0, w1, x, out0, out1, starts, ids, tile, chunks, mode)."""
    k0, k1 = int(WeightKind(k0)), int(WeightKind(k1))

    @jit
    def experts_par_kinds(w0, w1, x, out0, out1, starts, ids, tile, chunks, mode):
        experts_par(k0, k1, w0, w1, x, out0, out1, starts, ids, tile, chunks, mode)
    return jitcache.lazy(experts_par_kinds)
