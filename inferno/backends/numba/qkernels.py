"""Numba kernels that multiply GGML-quantized weights in place (see quant.py for the format).

A weight is its uint8 `[rows, row_bytes]` blocks, read where they lie (usually a read-only view
of the memory-mapped file) and never copied. Every kind is read the same way: a row is a run of
units (a block of 32 weights, or a K-quant super-block of eight groups of 32) whose scales are
decoded once (`unit_scales`); each group of 32 weights is two 16-lane halves of small integers
(`unit_q`), so that weight = s * q + m with the group's scales and offset (`group_scales`).
Kernels differ only in what they do with a group (vectors: lanes.py):

- the float32 kernels, for activations kept float32: decode (`matvec_rows`: two weight rows
  per pass sharing each load of x, 16-lane accumulators reduced once per row, the offset one
  scalar multiply-add per group), a few rows (`few_rows`: each group decoded once for up to
  four activation rows), and a prefill (`prefill_rows`: tiles dequantised into a float32
  scratch and fed to sgemm);
- the drivers of the integer kernels: the K-quants against int8 rows (qdot.py, qgemm.py,
  kpanels.py), the legacy kinds against int16 rows (ldot.py, lgemm.py);
- embedding (`embed_rows`): whole rows dequantised.

Which kernel a product takes is dispatch.py's table (weight kind, rows, columns, the backend's
activation settings, this CPU): the drivers here and experts.py read it and decide nothing.

The backends call the drivers through `linear_for`, `linear_par_for` and `linear_many_par_for`,
each compiled for the kinds it is given (see there): a model compiles and loads only its own.

Exactness: a group's products s * q are exact in float32 (an 11-bit half times integers of at
most 7 + 6 bits; MXFP4's power of two times integers of 4 bits), so dequantised weights equal the
gguf package's bit for bit, and the dot products differ from a float32 matmul of those weights
only by summation order.

Numba's own cache is keyed on a file's stamp alone (an edit to lanes.py, ilanes.py or qdot.py
would leave this file's machine code stale); jitcache.py keys inferno's kernel cache on every
backend source instead, so any edit below a kernel recompiles it.

Row geometry: cols is a multiple of 32 (the quantized kinds' blocks are 32 or 256 weights; a
F16/BF16 weight whose rows are not is kept as float32 by the backend instead).
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np
from numba import types
from numba.core.errors import TypingError
from numba.extending import overload

from inferno.backends.numba import dispatch, fdot, jitcache, kpanels, ldot, lgemm, qdot, qgemm
from inferno.backends.numba.quantizers import quantize_q4_0, quantize_q8_0
from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.dispatch import (  # the table of which kernel runs
    F_ROW, F_TILES, K_FEW, K_GEMM, K_ROWS, L_GEMM, L_ROWS, P_GEMM, int_dot,
)
from inferno.backends.numba.qdot import Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES  # as globals: literals to k_rows
from inferno.backends.numba.dense import FAST
from inferno.errors import InfernoError
from inferno.formats.quant import QTYPES, QUANTIZERS, QuantTensor
from inferno.backends.numba.lanes import (
    e8m0at, f16at, prefetch, stack_f32, u32at, vadd, vbf16, vf16, vfma, vfp4, vhalves, vi8,
    vkscales, vload, vmul, vnib, vnib5, vnibhi, vsplat, vstore, vsum, vzero,
)

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
jit_par = nb.njit(parallel=True, cache=True, nogil=True, fastmath=FAST)  # the pool's: rows cut across the team

# The weight kinds as the kernels branch on them: plain ints (codes.py says why).
F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q4_KX8, F32, MXFP4, MXFP4X16, Q4_0X16, Q4_1X16 = map(
    int, WeightKind)

# Activation rows from which the parallel drivers quantize them on every thread (a prefill's 512
# rows took 0.3-2 ms a call on one, serial before each product; a decode row stays on one thread,
# where a second launch would cost more than it saves).
PAR_ACTIVATIONS = 64
# Weight rows per pass of lgemm's panels: the parallel drivers split a prefill's rows on them.
PASS_ROWS = lgemm.PANELS * lgemm.ROWS


# -- units: one block of 32 weights, or a K-quant super-block of eight groups of 32 -------------------
K_GROUPS = 8
UNIT_BYTES = (64, 64, 34, 18, 20, 22, 24, 144, 176, 210, 144, 128, 17, 17, 18, 20)  # per kernel code: F16 .. X16


@jit
def unit_groups(kind):
    return K_GROUPS if kind >= Q4_K and kind <= Q4_KX8 else 1


@jit
def unit_scales(kind, f, o, sm):
    """Decode the scales of the unit at byte o into sm (16 float32, see group_scales): once per
    unit, so a K-quant super-block's packed 6-bit scales cost one vector unpack per 256 weights."""
    if kind == Q4_K or kind == Q5_K:  # f16 d, f16 dmin, 12 bytes of 6-bit scales and mins
        vstore(sm, 0, vmul(vkscales(f, o + 4), vhalves(f16at(f, o), -f16at(f, o + 2))))
    elif kind == Q6_K:  # 16 int8 scales at 192, one per 16 weights, f16 d at 208
        vstore(sm, 0, vmul(vi8(f, o + 192), vsplat(f16at(f, o + 208))))
    elif kind == F16 or kind == BF16:
        sm[0], sm[8] = 1.0, 0.0
    elif kind == MXFP4:  # an E8M0 byte: 2^(e - 128), times the table's integers (unit_q)
        sm[0], sm[8] = e8m0at(f, o), 0.0
    else:
        d = f16at(f, o)
        sm[0] = d
        if kind == Q4_1 or kind == Q5_1:
            sm[8] = f16at(f, o + 2)
        elif kind == Q4_0:
            sm[8] = np.float32(-8.0) * d
        elif kind == Q5_0:
            sm[8] = np.float32(-16.0) * d
        else:  # Q8_0
            sm[8] = 0.0


@jit
def group_scales(kind, sm, j):
    """(s_lo, s_hi, m): group j's weights are s_lo * lo + m (its first 16, lo from unit_q) and
    s_hi * hi + m (its last 16). Q6_K has a scale per 16 weights and no offset; every other kind
    one scale and one offset per group (sm[j], sm[8 + j])."""
    if kind == Q6_K:
        return sm[2 * j], sm[2 * j + 1], np.float32(0.0)
    return sm[j], sm[j], sm[8 + j]


@jit
def unit_q(kind, f, o, j):
    """Group j of the unit at byte o as two halves of 16 small integers (float32): (lo, hi)."""
    if kind == Q8_0:  # f16 d, 32 x int8
        return vi8(f, o + 2), vi8(f, o + 18)
    if kind == Q4_0:  # f16 d, 16 bytes of nibbles: weight i low, i + 16 high
        return vnib(f, o + 2, 0), vnib(f, o + 2, 4)
    if kind == Q4_1:  # f16 d, f16 m, 16 bytes of nibbles
        return vnib(f, o + 4, 0), vnib(f, o + 4, 4)
    if kind == Q5_0:  # f16 d, uint32 of fifth bits, 16 bytes of nibbles
        qh = u32at(f, o + 2)
        return vnib5(f, o + 6, 0, qh, 0), vnib5(f, o + 6, 4, qh, 16)
    if kind == Q5_1:  # f16 d, f16 m, uint32 of fifth bits, 16 bytes of nibbles
        qh = u32at(f, o + 4)
        return vnib5(f, o + 8, 0, qh, 0), vnib5(f, o + 8, 4, qh, 16)
    if kind == Q4_K:  # 16 bytes of header, then 128 of nibbles: group j is bytes 32 * (j // 2)
        q, shift = o + 16 + (j >> 1) * 32, (j & 1) * 4  # of those, low nibbles for even j
        return vnib(f, q, shift), vnib(f, q + 16, shift)
    if kind == Q5_K:  # as Q4_K after 32 bytes of fifth bits: weight i's is bit j of byte i
        q, shift = o + 48 + (j >> 1) * 32, (j & 1) * 4
        return vnibhi(f, q, shift, o + 16, j, 1, 0), vnibhi(f, q + 16, shift, o + 32, j, 1, 0)
    if kind == Q6_K:
        # 128 bytes of low nibbles, 64 of 2-bit highs; weight = scale * (q - 32). Group j: half
        # h = j // 4 of the block (128 weights), quarter t; its nibbles are bytes 64h + 32 (t % 2),
        # low ones for t < 2, its high bits bits 2t of bytes 32h of the highs.
        h, t = j >> 2, j & 3
        ql, qh, shift = o + 64 * h + 32 * (t & 1), o + 128 + 32 * h, (t >> 1) * 4
        return (vnibhi(f, ql, shift, qh, 2 * t, 3, 32),
                vnibhi(f, ql + 16, shift, qh + 16, 2 * t, 3, 32))
    if kind == MXFP4:  # E8M0 e, 16 bytes of nibbles as Q4_0's, each an index into a table
        return vfp4(f, o + 1, 0), vfp4(f, o + 1, 4)
    if kind == F16:
        return vf16(f, o), vf16(f, o + 32)
    return vbf16(f, o), vbf16(f, o + 32)  # BF16


@jit
def group_sums(x, xs, b0, b1):
    """xs[b, g] = sum of x[b, 32g:32g + 32] for rows b0..b1: the factor of every group's offset
    m."""
    for b in range(b0, b1):
        for g in range(xs.shape[1]):
            xs[b, g] = vsum(vadd(vload(x, b * x.shape[1] + 32 * g), vload(x, b * x.shape[1] + 32 * g + 16)))


# -- decode and a few activation rows ------------------------------------------------------------------
@jit
def activations(x, xs, mode):
    """What the row kernels take besides x: its group sums into xs, and for mode 1 or 2 x's rows
    as one or two int8 rows each (qdot.quantize; mode 0: qdot.empty(), the kernels keep
    float32)."""
    xq = activation_buffers(x, mode)
    activation_rows(x, xs, xq, np.int64(0), x.shape[0])
    return xq


@jit
def activation_buffers(x, mode):
    """Room for what `activations` returns, unwritten."""
    return qdot.buffers(x.shape[0], x.shape[1], mode == 2) if mode > 0 else qdot.empty()


@jit
def activation_rows(x, xs, xq, b0, b1):
    """`activations` for rows b0..b1 of x, into xs and xq (activation_buffers)."""
    group_sums(x, xs, b0, b1)
    if xq[0].shape[0] > 0:
        qdot.quantize_rows(x, xq[0], xq[1], xq[2], xq[3], xq[4], b0, b1)


def rows_kernel(kind, way, w, x, xs, xq, out, col, r0, r1):
    """out[:, col + r0:col + r1] = x @ w[r0:r1].T for x [B, cols] (dispatch.FEW_MAX at most, unless
    the kind takes int8 rows or is a float kind), xs its group sums,
    xq its row quantized or empty (`activations`), col where this weight's outputs start, in a
    buffer several weights share, through `way`, the table's kernel (dispatch.K_ROWS ..): a
    literal where the caller's rows are known (the entries made per path), else the table's
    answer when it runs (linear_many's pieces, the experts). Jitted code only (the overload
    below).

    Each kind gets its own compiled loops: a global constant passed to a jitted function is
    typed as a literal, so `_float_way(Q8_0, ...)` compiles a copy in which every branch on the kind
    folds away (nb.literal_unroll over the codes did not: it compiled one int64 copy). A switch
    on the kind inside the loops cost 5-30% of the matvec and 2-3x of few_rows (bench/RESULTS.md, "Figures behind the kernels' shape")."""
    raise TypeError("rows_kernel runs in jitted code only")


K_BYTES = {Q4_K: Q4_K_BYTES, Q5_K: Q5_K_BYTES, Q6_K: Q6_K_BYTES}


@overload(rows_kernel, prefer_literal=True, jit_options=dict(fastmath=FAST))
def _rows_kernel(kind, way, w, x, xs, xq, out, col, r0, r1):
    """Chosen while typing, from the kind's literal value (the drivers are made per kind): its
    own loops and nothing else, so Numba types and compiles no other kind's. (A switch on a
    literal kind folds away in LLVM, but only after Numba has compiled every branch's callees:
    the default model's first run compiled all ten kinds' loops, for two minutes.) A literal
    way compiles that kernel alone (the `*_way` functions' branches on it are pruned before
    typing: compiler.py), so a first answer's one-row step does not wait for the GEMM's
    panels; a run-time way compiles them all."""
    if not isinstance(kind, types.IntegerLiteral):
        raise TypingError("rows_kernel needs its kind as a compile-time constant: call the drivers "
                          "through linear_for, linear_par_for or linear_many_par_for")
    code = kind.literal_value
    if code in K_BYTES:
        ub = K_BYTES[code]

        def one_kind(kind, way, w, x, xs, xq, out, col, r0, r1):
            _int8_way(code, ub, way, w, x, xs, xq, out, col, r0, r1)
    elif code == Q4_KX8:
        def one_kind(kind, way, w, x, xs, xq, out, col, r0, r1):
            _panels_way(way, w, x, xq, out, col, r0, r1)
    elif code == F16 or code == BF16 or code == F32:  # dispatch.F_DOT, whatever the rows
        def one_kind(kind, way, w, x, xs, xq, out, col, r0, r1):
            fdot.f_rows(code, w, x, out[:, col:], r0, r1)
    else:
        def one_kind(kind, way, w, x, xs, xq, out, col, r0, r1):
            _float_way(code, way, w, x, xs, out, col, r0, r1)
    return one_kind


@jit
def _float_way(kind, way, w, x, xs, out, col, r0, r1):
    """float32 activations: one row (decode) or a few (dispatch: F_ROW, F_FEW)."""
    if way == F_ROW:
        matvec_rows(kind, w, x, xs, out[0, col:], r0, r1)
    else:
        few_rows(kind, w, x, xs, out[:, col:], r0, r1)


@jit
def _int8_way(kind, unit_bytes, way, w, x, xs, xq, out, col, r0, r1):
    """Q4_K, Q5_K or Q6_K (`unit_bytes` a literal, as qdot's kernels want it): in integers when xq
    holds the rows quantized (dispatch: K_ROWS, K_FEW, K_GEMM), else as _float_way."""
    if way == K_ROWS:
        qdot.k_rows(unit_bytes, w, xq[0], xq[1], xq[2], xq[3], xq[4], out[0, col:], r0, r1)
    elif way == K_GEMM:
        qgemm.k_gemm(unit_bytes, w, xq[0], xq[1], xq[2], xq[3], xq[4], out[:, col:], r0, r1)
    elif way == K_FEW:
        qdot.k_few(unit_bytes, w, xq[0], xq[1], xq[2], xq[3], xq[4], out[:, col:], r0, r1)
    else:
        _float_way(kind, way, w, x, xs, out, col, r0, r1)


@jit
def _panels_way(way, w, x, xq, out, col, r0, r1):
    """Q4_K in panels (kpanels.py): its int8 activations always (the backends repack only where
    they take them, and pass them; quantized here if not; dispatch: P_ROWS, P_GEMM)."""
    if xq[0].shape[0] == 0:
        xq = qdot.quantize(x, False)
    if way == P_GEMM:
        kpanels.p_gemm(w, xq[0], xq[1], xq[2], xq[3], xq[4], out[:, col:], r0, r1)
    else:
        kpanels.p_rows(w, xq[0], xq[1], xq[2], xq[3], xq[4], out[:, col:], r0, r1)


@jit
def accumulate(kind, acc, lo, hi, xl, xh, sm, j):
    """acc + s_lo lo xl + s_hi hi xh, lane by lane; one multiply fewer where the two halves
    share a scale (every kind but Q6_K)."""
    s_lo, s_hi, _ = group_scales(kind, sm, j)
    if kind == Q6_K:
        return vfma(vsplat(s_lo), vmul(lo, xl), vfma(vsplat(s_hi), vmul(hi, xh), acc))
    return vfma(vsplat(s_lo), vfma(lo, xl, vmul(hi, xh)), acc)


@jit
def paired(kind):
    """Whether matvec_rows takes this kind's groups two at a time: Q5_K's and Q6_K's groups
    share bytes in pairs (the low and high nibbles of the same 32; Q6_K's quarters t and t + 2
    of a half, and their high bits), which LLVM then loads once, with constant shifts. Pairing
    measured faster for those two and slower for Q4_K, so Q4_K is not paired (bench/RESULTS.md, "Figures behind the kernels' shape")."""
    return kind == Q5_K or kind == Q6_K


@jit
def group_pair(kind, i):
    """Pair i's groups (ja, jb) of a paired kind's unit."""
    if kind == Q6_K:
        return 4 * (i >> 1) + (i & 1), 4 * (i >> 1) + (i & 1) + 2
    return 2 * i, 2 * i + 1


@jit
def two_rows_group(kind, f, ua, uc, j, g, x, xs, sa, sc, a, c, ma, mc):
    """Group j (g of the row) of the units at bytes ua and uc, against x: the accumulators
    (a, c) and offset sums (ma, mc) of two rows, advanced."""
    xl, xh = vload(x, 32 * g), vload(x, 32 * g + 16)
    lo, hi = unit_q(kind, f, ua, j)
    a = accumulate(kind, a, lo, hi, xl, xh, sa, j)
    lo, hi = unit_q(kind, f, uc, j)
    c = accumulate(kind, c, lo, hi, xl, xh, sc, j)
    return a, c, ma + group_scales(kind, sa, j)[2] * xs[0, g], mc + group_scales(kind, sc, j)[2] * xs[0, g]


@jit
def matvec_rows(kind, w, x, xs, y, r0, r1):
    """y[r] = w[r] . x[0] for rows r0..r1: two rows per pass share the loads of x, 16-lane
    accumulators stay in registers and are summed once per row, and the offsets add up as
    sum(m * sum of x's group). While a pass reads its rows, one prefetch per group walks the
    next pass's bytes (rows are contiguous), so DRAM streams ahead of use."""
    f = w.reshape(-1)  # [rows * row_bytes]
    rb, n32 = w.shape[1], xs.shape[1]
    G, ub = unit_groups(kind), UNIT_BYTES[kind]
    step = 2 * rb // n32  # bytes of a pass per group
    sa = nb.carray(stack_f32(16), 16)  # the two rows' unit scales
    sc = nb.carray(stack_f32(16), 16)
    r = r0
    while r < r1:
        ra, rc = r * rb, min(r + 1, r1 - 1) * rb  # an odd last row is paired with itself
        a, c = vzero(), vzero()
        ma, mc = np.float32(0.0), np.float32(0.0)
        for u in range(n32 // G):
            ua, uc = ra + u * ub, rc + u * ub
            unit_scales(kind, f, ua, sa)
            unit_scales(kind, f, uc, sc)
            per = 2 if paired(kind) else 1
            for i in range(G // per):
                ja, jb = group_pair(kind, i) if per == 2 else (i, i)
                p = rc + rb + (u * G + per * i) * step
                prefetch(f, p)
                if per * step > 64:  # two groups' worth, or F16/BF16's two lines a group
                    prefetch(f, p + 64)
                a, c, ma, mc = two_rows_group(kind, f, ua, uc, ja, u * G + ja, x, xs, sa, sc, a, c, ma, mc)
                if per == 2:
                    a, c, ma, mc = two_rows_group(kind, f, ua, uc, jb, u * G + jb, x, xs, sa, sc, a, c, ma, mc)
        y[r] = vsum(a) + ma
        if r + 1 < r1:
            y[r + 1] = vsum(c) + mc
        r += 2


@jit
def few_rows(kind, w, x, xs, out, r0, r1):
    """out[b, r] = w[r] . x[b] for rows r0..r1 and every row b of x [B, cols]: each group of a
    weight row decoded and scaled once for four activation rows (then two, then one)."""
    f = w.reshape(-1)
    rb, n32, n, B = w.shape[1], xs.shape[1], x.shape[1], x.shape[0]
    G, ub = unit_groups(kind), UNIT_BYTES[kind]
    sm = nb.carray(stack_f32(16), 16)
    for r in range(r0, r1):
        b = 0
        while b < B:
            rows = 4 if b + 4 <= B else (2 if b + 2 <= B else 1)
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            m0 = m1 = m2 = m3 = np.float32(0.0)
            for u in range(n32 // G):
                o = r * rb + u * ub
                unit_scales(kind, f, o, sm)
                for j in range(G):
                    g = u * G + j
                    s_lo, s_hi, m = group_scales(kind, sm, j)
                    lo, hi = unit_q(kind, f, o, j)
                    lo, hi = vmul(lo, vsplat(s_lo)), vmul(hi, vsplat(s_hi))
                    xo = b * n + 32 * g
                    a0 = vfma(lo, vload(x, xo), vfma(hi, vload(x, xo + 16), a0))
                    m0 += m * xs[b, g]
                    if rows >= 2:
                        a1 = vfma(lo, vload(x, xo + n), vfma(hi, vload(x, xo + n + 16), a1))
                        m1 += m * xs[b + 1, g]
                    if rows == 4:
                        a2 = vfma(lo, vload(x, xo + 2 * n), vfma(hi, vload(x, xo + 2 * n + 16), a2))
                        a3 = vfma(lo, vload(x, xo + 3 * n), vfma(hi, vload(x, xo + 3 * n + 16), a3))
                        m2 += m * xs[b + 2, g]
                        m3 += m * xs[b + 3, g]
            out[b, r] = vsum(a0) + m0
            if rows >= 2:
                out[b + 1, r] = vsum(a1) + m1
            if rows == 4:
                out[b + 2, r], out[b + 3, r] = vsum(a2) + m2, vsum(a3) + m3
            b += rows


# -- whole rows ----------------------------------------------------------------------------------------
@jit
def dequant_row(kind, f, ro, n32, out, oo):
    """The row at byte ro as float32 into out.flat[oo:oo + 32 * n32]."""
    if kind == Q4_KX8:  # its row unpacked to the file's layout first
        rb = n32 // K_GROUPS * Q4_K_BYTES
        row = np.empty(rb, np.uint8)
        kpanels.unpanel_row(f, rb, ro // rb, row, 0)
        _dequant_row(Q4_K, row, 0, n32, out, oo)
    else:
        _dequant_row(kind, f, ro, n32, out, oo)


@jit
def _dequant_row(kind, f, ro, n32, out, oo):
    """dequant_row of a kind whose rows lie whole at their bytes."""
    G, ub = unit_groups(kind), UNIT_BYTES[kind]
    sm = nb.carray(stack_f32(16), 16)
    for u in range(n32 // G):
        unit_scales(kind, f, ro + u * ub, sm)
        for j in range(G):
            s_lo, s_hi, m = group_scales(kind, sm, j)
            lo, hi = unit_q(kind, f, ro + u * ub, j)
            o = oo + 32 * (u * G + j)
            vstore(out, o, vfma(lo, vsplat(s_lo), vsplat(m)))
            vstore(out, o + 16, vfma(hi, vsplat(s_hi), vsplat(m)))


@jit
def dequant_rows(kind, w, out, r0, r1):
    """out[:r1 - r0] = rows r0..r1 of w as float32; out [>= r1 - r0, cols]."""
    f = w.reshape(-1)
    n = out.shape[1]
    for r in range(r0, r1):
        dequant_row(kind, f, r * w.shape[1], n // 32, out, (r - r0) * n)


def dequantize(w, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1 of QuantTensor w as float32 [r1 - r0, cols]: equal to w.dequantize(r0, r1),
    about a hundred times as fast (for backends that keep float weights)."""
    out = np.empty((r1 - r0, w.shape[1]), dtype=np.float32)
    if w.shape[1] % 32:
        out[:] = w.dequantize(r0, r1)  # a 16-bit row not in whole groups (F16/BF16 only)
    else:
        dequant_rows(int(WeightKind.of(w)), w.data, out, r0, r1)
    return out


@jit
def embed_rows(kind, w, ids, out, i0, i1):
    """out[i] = row ids[i] of w as float32, for i in i0..i1."""
    f = w.reshape(-1)
    n = out.shape[1]
    for i in range(i0, i1):
        dequant_row(kind, f, ids[i] * w.shape[1], n // 32, out, i * n)


@jit
def prefill_rows(kind, w, x, out, r0, r1, tile, scratch):
    """out[:, r0:r1] = x @ w[r0:r1].T through sgemm, dequantising `tile` rows at a time into
    scratch [tile, cols] and the product into scratch's tail [tile * cols:] as [B, tile]."""
    n, B = x.shape[1], x.shape[0]
    rows = scratch[:tile * n].reshape((tile, n))
    prod = scratch[tile * n:tile * n + B * tile].reshape((B, tile))
    for t0 in range(r0, r1, tile):
        t = min(tile, r1 - t0)
        dequant_rows(kind, w, rows, t0, t0 + t)
        part = prod if t == tile else np.dot(x, rows[:t].T)
        if t == tile:
            np.dot(x, rows.T, prod)
        for b in range(B):  # (loops: a slice assignment's shape check compiles its message)
            for j in range(t):
                out[b, t0 + j] = part[b, j]


# -- the drivers: one per path a product takes, each compiled alone ----------------------------------
# `linear` (the chooser made by linear_for / linear_par_for) picks the path in Python, from the
# rows of x, the kind and the backend's settings; each path's driver is compiled for one kind
# when a product first takes it. (One driver holding every path compiled them all, each for
# 13-15 s on the default model's first run, where a short reply takes two of them.)
LEGACY_ROW, LEGACY_GEMM, PREFILL, ROWS = "legacy_row", "legacy_gemm", "prefill", "rows"


def linear_path(way: int) -> str:
    """Which driver runs the table's kernel `way` (dispatch.kernel): lgemm's GEMM (LEGACY_GEMM),
    l_rows (LEGACY_ROW), dequantised tiles and sgemm (PREFILL), or the row kernels, which take
    the rest (ROWS: an entry for each way)."""
    if way == L_ROWS:
        return LEGACY_ROW
    if way == L_GEMM:
        return LEGACY_GEMM
    return PREFILL if way == F_TILES else ROWS


# -- the pool backend's launches: rows split across Numba's OpenMP team ------------------------------
@nb.njit(cache=True, nogil=True, inline="always")
def chunk_start(n, c, chunks, align):
    """Start of chunk c of `chunks` over n rows, on a multiple of `align` (c == chunks: n); the
    pool backend's kernels split their rows with it too. Row bounds reach the kernels as int64,
    from here or as np.int64(0) on one thread: Numba hands a constant's literal type on to a
    jitted callee, so a literal 0 would have compiled every kernel below it a second time."""
    if c >= chunks:
        return n
    return (n * c // chunks) // align * align


@nb.njit(parallel=True, cache=True, fastmath=FAST)
def activations_par(x, mode, chunks):
    """(xs, xq) as `activations` makes them, the rows split across the team when there are
    enough of them (PAR_ACTIVATIONS)."""
    B = x.shape[0]
    xs = np.empty((B, x.shape[1] // 32), np.float32)
    xq = activation_buffers(x, mode)
    if B >= PAR_ACTIVATIONS:
        for c in nb.prange(chunks):
            activation_rows(x, xs, xq, chunk_start(B, c, chunks, 1), chunk_start(B, c + 1, chunks, 1))
    else:
        activation_rows(x, xs, xq, np.int64(0), B)
    return xs, xq


@nb.njit(parallel=True, cache=True, fastmath=FAST)
def quantized_par(x, chunks):
    """ldot.quantized's (x16, dx, xs), the rows split across the team when there are enough of
    them (PAR_ACTIVATIONS)."""
    B, n = x.shape
    if B < PAR_ACTIVATIONS:
        return ldot.quantized(x)
    x16 = np.empty((B, n), np.int16)
    dx = np.empty((B, n // 32), np.float32)
    xs = np.empty((B, n // 32), np.float32)
    for c in nb.prange(chunks):
        ldot.quantize_rows(x, x16, dx, xs, chunk_start(B, c, chunks, 1), chunk_start(B, c + 1, chunks, 1))
    return x16, dx, xs


def piece(kind, row_way, few_way, mode, w, x, xs, xq, lx, out, start, lo, hi):
    """The part of out's columns lo..hi that falls in w's rows, w's outputs starting at column
    `start`, through the table's kernel for x's rows: `row_way` or `few_way` (`ways`), literals,
    so that only their loops are typed and compiled; returns where the next weight's start."""
    raise TypeError("piece runs in jitted code only")


@overload(piece, prefer_literal=True, jit_options=dict(fastmath=FAST))
def _piece_for(kind, row_way, few_way, mode, w, x, xs, xq, lx, out, start, lo, hi):
    if not all(isinstance(a, types.IntegerLiteral) for a in (kind, row_way, few_way)):
        raise TypingError("piece needs its kind and its ways as compile-time constants")
    code, one, few = kind.literal_value, row_way.literal_value, few_way.literal_value
    if one == L_ROWS:
        def impl(kind, row_way, few_way, mode, w, x, xs, xq, lx, out, start, lo, hi):
            r0, r1 = max(lo - start, 0), min(hi - start, w.shape[0])
            if r0 < r1:
                legacy_rows(code, w, lx[0], lx[1], lx[2], out[:, start:], r0, r1)
            return start + w.shape[0]
    else:
        def impl(kind, row_way, few_way, mode, w, x, xs, xq, lx, out, start, lo, hi):
            r0, r1 = max(lo - start, 0), min(hi - start, w.shape[0])
            if r0 < r1:
                if dispatch.kernel(code, x.shape[0], x.shape[1], mode, False) == one:
                    rows_kernel(code, one, w, x, xs, xq, out, start, r0, r1)
                else:
                    rows_kernel(code, few, w, x, xs, xq, out, start, r0, r1)
            return start + w.shape[0]
    return impl


def _legacy_kinds_only(stub, kernel):
    """Overload `stub` (kind, w, x16, dx, xs, out, r0, r1) as `kernel` for a legacy kind (a
    literal); for any other kind nothing, and nothing compiled."""
    @overload(stub, prefer_literal=True, jit_options=dict(fastmath=FAST))
    def _for_kind(kind, w, x16, dx, xs, out, r0, r1):
        if not isinstance(kind, types.IntegerLiteral):
            raise TypingError(f"{stub.__name__} needs its kind as a compile-time constant")
        code = kind.literal_value
        if ldot.legacy(code):
            def one_kind(kind, w, x16, dx, xs, out, r0, r1):
                kernel(code, w, x16, dx, xs, out, r0, r1)
        else:
            def one_kind(kind, w, x16, dx, xs, out, r0, r1):
                pass
        return one_kind


def legacy_rows(kind, w, x16, dx, xs, out, r0, r1):
    """ldot.l_rows for a legacy kind (a literal); for any other kind nothing, and nothing
    compiled (jitted code only: the overload below)."""
    raise TypeError("legacy_rows runs in jitted code only")


def legacy_gemm(kind, w, x16, dx, xs, out, r0, r1):
    """lgemm.l_gemm for a legacy kind (a literal); for any other kind nothing, and nothing
    compiled (jitted code only: the overload below)."""
    raise TypeError("legacy_gemm runs in jitted code only")


_legacy_kinds_only(legacy_rows, ldot.l_rows)
_legacy_kinds_only(legacy_gemm, lgemm.l_gemm)


# -- the drivers compiled per kind -----------------------------------------------------------------
# The drivers took the kind as a run-time argument and compiled every kind's loops into one
# object (1.2 MB of machine code for linear_par; the default model's first run compiled for two
# minutes). Each entry below is made for the kinds it is given by a factory whose closure holds
# them: Numba takes a closure's variables as compile-time literals (as it does globals), its
# cache keys the entry on them, and rows_kernel's overload then types only those kinds' loops.
# A model compiles and loads only the kinds it holds.
@functools.cache
def _path_entry(path: str, kind: int, parallel: bool, way: int | None = None):
    """The driver of `path` for `kind` (on the team where `parallel`), compiled apart: a closure
    over the kind alone (see above), and for ROWS over the table's kernel too (`way`, the
    chooser's dispatch.K_ROWS ..), so that a kind's one-row step and its GEMM compile apart.
    Each calls the kernels itself: a driver between it and them would have compiled their
    machine code once more (Numba links a callee's code into each caller's and optimizes and
    emits it again there; bench/RESULTS.md, "Fewer layers")."""
    if path == LEGACY_GEMM:
        return legacy_gemm_par_for(kind) if parallel else legacy_gemm_for(kind)
    if path == LEGACY_ROW and parallel:
        @jit_par
        def legacy_row_par_kind(w, x, out, chunks):
            n = w.shape[0]
            x16, dx, xs16 = ldot.quantized(x)
            o = out[:, 0:]  # (typed as linear_many's `piece` slices it: one compile of the kernels for both)
            for c in nb.prange(chunks):
                ldot.l_rows(kind, w, x16, dx, xs16, o, chunk_start(n, c, chunks, 8),
                            chunk_start(n, c + 1, chunks, 8))
        return jitcache.lazy(legacy_row_par_kind)
    if path == LEGACY_ROW:  # a few rows (dispatch.LEGACY_FEW), x as int16 rows
        @jit
        def legacy_row_kind(w, x, out):
            x16, dx, xs16 = ldot.quantized(x)
            ldot.l_rows(kind, w, x16, dx, xs16, out[:, 0:], np.int64(0), w.shape[0])  # (as above)
        return jitcache.lazy(legacy_row_kind)
    if path == PREFILL and parallel:  # w's tiles split into `chunks` ranges, each with its scratch
        @jit_par
        def prefill_par_kind(w, x, out, tile, chunks):
            n = w.shape[0]
            tiles = (n + tile - 1) // tile
            scratch = np.empty((chunks, tile * x.shape[1] + x.shape[0] * tile), np.float32)  # one per thread
            for c in nb.prange(chunks):
                t0, t1 = chunk_start(tiles, c, chunks, 1), chunk_start(tiles, c + 1, chunks, 1)
                prefill_rows(kind, w, x, out, t0 * tile, min(t1 * tile, n), tile, scratch[c])
        return jitcache.lazy(prefill_par_kind)
    if path == PREFILL:  # dequantised tiles of `tile` rows and sgemm
        @jit
        def prefill_kind(w, x, out, tile):
            scratch = np.empty(tile * x.shape[1] + x.shape[0] * tile, np.float32)
            prefill_rows(kind, w, x, out, np.int64(0), w.shape[0], tile, scratch)
        return jitcache.lazy(prefill_kind)
    int8 = int_dot(kind)  # the row kernels take x as int8 rows for mode 1 or 2 if the kind can
    if parallel:  # whole panels of qgemm's in a range where they fit
        @jit_par
        def rows_par_kind(w, x, out, mode, chunks):
            n = w.shape[0]
            xs, xq = activations_par(x, mode if int8 else np.int64(0), chunks)
            for c in nb.prange(chunks):
                rows_kernel(kind, way, w, x, xs, xq, out, np.int64(0), chunk_start(n, c, chunks, qgemm.ROWS),
                            chunk_start(n, c + 1, chunks, qgemm.ROWS))
        return jitcache.lazy(rows_par_kind)

    @jit
    def rows_kind(w, x, out, mode):
        xs = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
        xq = activations(x, xs, mode if int8 else np.int64(0))
        rows_kernel(kind, way, w, x, xs, xq, out, np.int64(0), np.int64(0), w.shape[0])
    return jitcache.lazy(rows_kind)


@functools.cache
def linear_for(kind: WeightKind):
    """x @ w.T for one kind, on the calling thread: (w, x, out, tile, mode, legacy), through
    the path `linear_path` picks."""
    kind = int(WeightKind(kind))

    def linear(w, x, out, tile, mode, legacy):
        way = dispatch.kernel(kind, x.shape[0], x.shape[1], mode, legacy)
        path = linear_path(way)
        if path == LEGACY_ROW:
            _path_entry(path, kind, False)(w, x, out)
        elif path == LEGACY_GEMM:
            _path_entry(path, kind, False)(w, *ldot.quantized(x), out)
        elif path == PREFILL:
            _path_entry(path, kind, False)(w, x, out, tile)
        else:
            _path_entry(path, kind, False, way)(w, x, out, mode)
    return linear


@functools.cache
def linear_par_for(kind: WeightKind):
    """`linear_for`, w's rows split across the team: (w, x, out, tile, chunks, mode, legacy)."""
    kind = int(WeightKind(kind))

    def linear_par(w, x, out, tile, chunks, mode, legacy):
        way = dispatch.kernel(kind, x.shape[0], x.shape[1], mode, legacy)
        path = linear_path(way)
        if path == LEGACY_ROW:
            _path_entry(path, kind, True)(w, x, out, chunks)
        elif path == LEGACY_GEMM:
            _path_entry(path, kind, True)(w, *quantized_par(x, chunks), out, chunks)
        elif path == PREFILL:
            _path_entry(path, kind, True)(w, x, out, tile, chunks)
        else:
            _path_entry(path, kind, True, way)(w, x, out, mode, chunks)
    return linear_par


@functools.cache  # (decode asks for it 60 times a token)
def linear_many_par_for(k0: WeightKind, k1: WeightKind, k2: WeightKind, legacy: bool = False,
                        int8: bool = True, gemm: bool = False):
    """out = x @ [w.T for w in ws], side by side in out [B, sum of rows], in one launch, for
    the few rows of x that dispatch.shared_launch admits: the three weights' rows (kinds k0, k1,
    k2), taken end to end as one range, split into `chunks` pieces (a piece may span two
    weights): (ws, x, out, chunks, mode). The weights may differ in kind and rows; they share
    cols, so a row costs about the same in any. Each takes x as it would alone (`linear`): a
    K-quant its int8 rows where `int8` (the backend's mode 1 or 2), a legacy kind where `legacy`
    says so its int16 rows, any other x as float32. `gemm`: x's rows and cols are of
    dispatch.gemm_size (a batch of 16 sequences), which an entry of its own serves."""
    kinds = [int(WeightKind(k)) for k in (k0, k1, k2)]
    mode = 1 if int8 else 0
    return _many_for(*(w for k in kinds for w in (k, *dispatch.shared_ways(k, mode, legacy, gemm))))


@functools.cache
def _many_for(k0, a0, b0, k1, a1, b1, k2, a2, b2):
    """linear_many_par_for's entry, for three weights each of a kind (k) and the two kernels
    the table gives it in a shared launch (a for a row, b for more: dispatch.shared_ways),
    settled here, in the closure, so that an entry compiles those loops only: a decode step's
    not the GEMMs, nor the float32 loops of a kind that takes int8 rows. (Kinds and settings that
    give the same kernels share an entry.)"""
    rows_in = any(a != L_ROWS for a in (a0, a1, a2))  # some weight runs the row kernels
    int8 = any(int_dot(k) for k in (k0, k1, k2))  # some weight can take int8 rows (those of `mode`)
    x16 = L_ROWS in (a0, a1, a2)

    @nb.njit(parallel=True, cache=True, fastmath=FAST)
    def linear_many_par_kinds(ws, x, out, chunks, mode):
        m = mode if int8 else np.int64(0)
        if rows_in:
            xs, xq = activations_par(x, m, chunks)
        else:
            xs, xq = x, x  # (not read)
        if x16:
            lx = ldot.quantized(x)
        else:
            lx = (np.empty((0, 0), np.int16), x, x)  # (not read)
        total = out.shape[1]
        for c in nb.prange(chunks):
            # whole panels: kpanels' (P), and l_rows' passes of eight
            lo, hi = chunk_start(total, c, chunks, kpanels.P), chunk_start(total, c + 1, chunks, kpanels.P)
            start = piece(k0, a0, b0, m, ws[0], x, xs, xq, lx, out, np.int64(0), lo, hi)
            start = piece(k1, a1, b1, m, ws[1], x, xs, xq, lx, out, start, lo, hi)
            piece(k2, a2, b2, m, ws[2], x, xs, xq, lx, out, start, lo, hi)
    return jitcache.lazy(linear_many_par_kinds)


@functools.cache
def legacy_gemm_for(kind: WeightKind):
    """lgemm's GEMM over all of a legacy weight's rows, its activations already quantized
    (ldot.quantized: weights that share x share one rounding): (w, x16, dx, xs, out)."""
    kind = int(WeightKind(kind))

    @jit
    def legacy_gemm_kind(w, x16, dx, xs, out):
        lgemm.l_gemm(kind, w, x16, dx, xs, out, np.int64(0), w.shape[0])
    return jitcache.lazy(legacy_gemm_kind)


@functools.cache
def legacy_gemm_par_for(kind: WeightKind):
    """`legacy_gemm_for`, the rows split into `chunks` ranges of whole passes (PASS_ROWS), each on
    a thread of the team: (w, x16, dx, xs, out, chunks)."""
    kind = int(WeightKind(kind))

    @jit_par
    def legacy_gemm_par_kind(w, x16, dx, xs, out, chunks):
        rows = w.shape[0]
        for c in nb.prange(chunks):
            lgemm.l_gemm(kind, w, x16, dx, xs, out, chunk_start(rows, c, chunks, PASS_ROWS),
                         chunk_start(rows, c + 1, chunks, PASS_ROWS))
    return jitcache.lazy(legacy_gemm_par_kind)


@functools.cache
def embed_for(kind: WeightKind, parallel: bool):
    """Rows of a table of one kind as float32, out[i] = row ids[i] (embed_rows), compiled for that
    kind alone: (w, ids, out), or on the team where `parallel`, (w, ids, out, chunks). (With the
    kind an argument, every kind's dequantisation compiled: 2 s of the first answer.)"""
    kind = int(WeightKind(kind))
    if parallel:
        @jit_par
        def embed_par_kind(w, ids, out, chunks):
            for c in nb.prange(chunks):
                embed_rows(kind, w, ids, out, chunk_start(len(ids), c, chunks, 1),
                           chunk_start(len(ids), c + 1, chunks, 1))
        return jitcache.lazy(embed_par_kind)

    @jit
    def embed_kind(w, ids, out):
        embed_rows(kind, w, ids, out, np.int64(0), len(ids))
    return jitcache.lazy(embed_kind)


# -- quantizing float32 rows (quantize, below), bit for bit as the gguf package does: each row's
# blocks by quantizers.py's kernels, the rows split across the team ---------------------------------
@nb.njit(parallel=True, cache=True)
def quantize_par(w, out, q8, chunks):
    """quantize_q8_0 (q8) or quantize_q4_0 over all rows, split into chunks across threads."""
    rows = w.shape[0]
    for c in nb.prange(chunks):
        r0, r1 = chunk_start(rows, c, chunks, 1), chunk_start(rows, c + 1, chunks, 1)
        if q8:
            quantize_q8_0(w, out, r0, r1)
        else:
            quantize_q4_0(w, out, r0, r1)


def quantize(w: np.ndarray, qtype: str) -> QuantTensor:
    """float32 rows w [rows, cols] quantized to "q8_0" or "q4_0" (for `--weights`): the same
    bytes as the gguf package's quantizers (ports of ggml's reference ones), on all cores (and
    several times the gguf package's rate on one)."""
    if qtype not in QUANTIZERS:
        raise InfernoError(f"cannot quantize to {qtype!r}; choose one of: {', '.join(QUANTIZERS)}")
    w = np.ascontiguousarray(w, dtype=np.float32)
    rows, cols = w.shape
    if cols % 32:
        raise InfernoError(f"{qtype} needs rows of whole 32-weight blocks, got {cols} columns")
    q = QTYPES[qtype.upper()]
    out = np.empty((rows, q.row_bytes(cols)), dtype=np.uint8)
    quantize_par(w, out, qtype == "q8_0", max(1, min(nb.get_num_threads(), rows)))
    return QuantTensor(q, (rows, cols), out)
