"""Numba flash attention for the simd and pool backends: one query head per call.

Serial and GIL-free like the dense kernels (dense.py, whose FAST flags and exp it shares); the
pool backend runs one head per job, the simd backend walks the heads in flash_heads.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from numba.extending import register_jitable

from inferno.backends.base import TILE
from inferno.backends.numba.dense import FAST, exp_into

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)


@jit
def query_block(seq_k):
    """Query rows per block in the tiled flash kernel. Each block streams the head's K and V
    once, so long prompts want taller blocks (fewer passes over K/V, taller GEMMs) and short ones
    short blocks (less masked work in the diagonal tiles). The switch points are where one core
    measured each height fastest (bench/RESULTS.md, "Figures behind the kernels' shape")."""
    if seq_k < 768:
        return 64
    return 128 if seq_k < 3072 else 256


@jit
def flash_head(q, k, v, out, h, kv_h, head_dim, causal, window, scale, sinks):
    """Flash attention for query head h over KV head kv_h, written into out's columns for h.

    Walks blocks of query rows (query_block); for each, tiles of TILE keys. A tile's scores are
    one small GEMM ([block, hd] x [hd, TILE], BLAS) into a local buffer; the online softmax runs
    on it (per row: running max m, sum l, rescale factor corr; one vectorised exp for the whole
    tile), then a second GEMM adds the tile's probabilities x V into the accumulator. Causal and
    the sliding window are loop bounds: a block visits keys from its first row's oldest visible
    key (position - window + 1) to its last row's diagonal (bottom-right aligned, seq_k - seq_q
    rows of offset), or without `causal` to its last row's newest visible key (position +
    window - 1, where there is a window: base.visible_end); inside the edge tiles a row's hidden
    scores get -inf.

    `sinks` (float32 [n_heads]; base.Backend.flash_attention_prefill): head h's sink starts each
    row's running max m, with a running sum l of 1, as a column seen before any key. It is always
    an array (-inf: no sink), so one compiled kernel serves models with sinks and without; a
    sink of -inf starts m = -inf, l = 0, as a kernel without sinks would, and changes no bit.
    """
    seq_q, seq_k = q.shape[0], k.shape[0]
    off = seq_k - seq_q
    hd = head_dim
    qc, kc = h * hd, kv_h * hd
    scale32 = np.float32(scale)
    qh = np.empty((seq_q, hd), np.float32)  # [seq_q, hd] this head's queries, scaled as the reference
    kh = np.empty((seq_k, hd), np.float32)  # [seq_k, hd] its keys and values, contiguous for BLAS
    vh = np.empty((seq_k, hd), np.float32)
    for i in range(seq_q):
        q_row, qh_row = q[i, qc:qc + hd], qh[i]
        for d in range(hd):
            qh_row[d] = q_row[d] * scale32
    for i in range(seq_k):  # (loops: a slice assignment's shape check compiles its message)
        for d in range(hd):
            kh[i, d] = k[i, kc + d]
            vh[i, d] = v[i, kc + d]
    span = (window if causal else 2 * window - 1) if window > 0 else seq_k
    qb = query_block(min(seq_k, span))  # keys a block streams
    s_buf = np.empty(qb * TILE, np.float32)  # one tile of scores, then probabilities: [block, TILE]
    shifted = np.empty(qb * TILE, np.float32)  # scores minus their row's running max
    bits = np.empty(qb * TILE, np.int32)
    pv_buf = np.empty(qb * hd, np.float32)  # the tile's probabilities @ V: [block, hd]
    acc = np.empty((qb, hd), np.float32)  # running numerators
    m = np.empty(qb, np.float32)
    l = np.empty(qb, np.float32)  # running denominators
    corr = np.empty(qb, np.float32)
    sink = sinks[h]
    for q0 in range(0, seq_q, qb):
        q1 = min(q0 + qb, seq_q)
        bq = q1 - q0
        m[:bq] = sink  # the sink's column, seen first: it adds exp(sink - m) = 1 to l
        l[:bq] = 0.0 if sink == -np.inf else 1.0
        acc[:bq] = 0.0
        k_start = max(0, off + q0 - window + 1) if window > 0 else 0  # the block's oldest key
        k_end = _visible_end(causal, window, off + q1 - 1, seq_k)  # keys the block's last row sees
        for k0 in range(k_start, k_end, TILE):
            bk = min(TILE, k_end - k0)
            s = s_buf[:bq * bk].reshape((bq, bk))  # [bq, bk]
            np.dot(qh[q0:q1], kh[k0:k0 + bk].T, s)
            for i in range(bq):
                row, sh = s[i], shifted[i * bk:(i + 1) * bk]
                hi = max(0, min(bk, _visible_end(causal, window, off + q0 + i, seq_k) - k0))  # keys row i sees:
                lo = min(hi, max(0, off + q0 + i - window + 1 - k0)) if window > 0 else 0  # lo..hi
                mx = m[i]
                for j in range(lo, hi):
                    mx = max(mx, row[j])
                sh[:lo] = -np.inf  # older than the window: probability 0
                for j in range(lo, hi):
                    sh[j] = row[j] - mx
                sh[hi:] = -np.inf  # this row's future
                corr[i] = np.float32(math.exp(m[i] - mx)) if hi > lo else np.float32(1.0)  # 0 on a first tile
                m[i] = mx
            exp_into(shifted, s_buf, bits, bq * bk)  # s now holds the tile's probabilities
            for i in range(bq):
                row = s[i]
                total = np.float32(0.0)
                for j in range(bk):
                    total += row[j]
                l[i] = l[i] * corr[i] + total
            pv = pv_buf[:bq * hd].reshape((bq, hd))  # [bq, hd]
            np.dot(s, vh[k0:k0 + bk], pv)
            for i in range(bq):
                c, a, p = corr[i], acc[i], pv[i]
                for d in range(hd):
                    a[d] = a[d] * c + p[d]
        for i in range(bq):
            inv = np.float32(1.0) / l[i]
            a, o = acc[i], out[q0 + i, qc:qc + hd]
            for d in range(hd):
                o[d] = a[d] * inv


@register_jitable
def _visible_end(causal, window, pos, seq_k):
    """base.visible_end: one past the newest key a query at `pos` sees."""
    if causal:
        return min(pos + 1, seq_k)
    return min(pos + window, seq_k) if window > 0 else seq_k


# -- serial drivers (the simd backend) -----------------------------------------------------------
@jit
def flash_heads(q, k, v, out, n_heads, n_kv_heads, head_dim, causal, window, scale, sinks):
    group = n_heads // n_kv_heads
    for h in range(n_heads):
        flash_head(q, k, v, out, h, h // group, head_dim, causal, window, scale, sinks)
