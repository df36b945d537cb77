"""Matvecs and few-row products of K-quant weights (Q4_K, Q5_K, Q6_K) against int8 activations:
integer dot products, as llama.cpp computes them (ggml's ggml_vec_dot_q4_K_q8_K and _q6_K_q8_K),
with a second int8 row for what the first leaves where a weight's inputs carry outliers.

Why: with float32 activations a weight costs a widening, a conversion and a float multiply-add
per activation row; as bytes, x86 multiplies 32
weights by 32 activations and adds them in pairs in one instruction (ilanes.py), and the
K-quants' sub-block scales are integers, so a super-block's 256 products sum in int32 lanes
(maddwd by the scales) and become float once. Each activation row is quantized once per call
(`quantize_rows`), per unit of 256 values (a row's last unit may be shorter, a multiple of 32):
x ~ dx * qx + dr * rx, qx = round(x / dx) with dx = max|x| / 127 (ggml's Q8_K), and rx the same
of the remainder x - dx * qx. ggml's single row moved whole-model logits by 4-5e-2 of their
range against transformers, with 95-98% top-1 agreement (SmolLM2 Q4_K_M, Gemma 3 270M, decoded
token by token); a scale per 32 instead would still have missed 1e-2 (2.6e-2, simulated); the
remainder row, on the weights whose inputs are heavy-tailed (QuantTensor.outlier_inputs:
o_proj, down_proj), brings the activations' rounding to 1/254 of ggml's at the cost of a second
maddubs on the weight bytes already loaded.

A super-block's dot product is then, for Q4_K (weight = d sc_g q - dmin m_g, q in 0..15; Q5_K
the same with q in 0..31, its fifth bits in 32 bytes of their own):
  d dx sum_g sc_g (q . qx)_g + d dr sum_g sc_g (q . rx)_g - dmin dx sum_g m_g Qx_g - dmin dr sum_g m_g Rx_g
and for Q6_K (weight = d sc_s (q - 32), q in 0..63, a scale per 16) the same with sc_s for both
sc_g and m_g and -32 d for -dmin, where Qx_g and Rx_g are the sums of qx and rx over group g
(`quantize_rows` keeps them). The four sums are integers (in int32 lanes, far from overflow;
above 2^24 their conversion to float rounds, alike in every kernel), so a matvec equals the
dequantised weights times x' = dx qx + dr rx up to float32 rounding: the error against float32 activations is the remainder's rounding alone, sum_i |w_i|
dr / 2 at most (tests/ops/test_linear.py checks both). They become the result in one fixed
order of float operations (`k_tail`), the same in every kernel.

Rows: for one activation row (`k_rows`), two weight rows per pass share each load of the
activation bytes, and prefetches walk the next pass's rows, a cache line each, as
qkernels.matvec_rows does; for a few (`k_few`, the server's batched decode step), each weight
row's super-blocks meet four activation rows per pass, unpacked once for all four.

Where this does not pay: the legacy kinds (Q4_0..Q8_0) have a float16 scale per 32 weights, so
each group's int32 lanes need a conversion and a float multiply-add of their own. Written that
way (dpbusd, cvt, fma per group and activation row) it ran no faster than their float32 kernels
on Zen 4, whose float vectors are 16 lanes; where they are 8 the integer matvec wins, and
ldot.py is it (in int16: one int8 row was too coarse for them). Transposing eight weight rows by quads into the int32 lanes, so that one conversion
serves eight rows' blocks, beat float32 from eight activation rows on but lost below (packing
the transposed blocks decides small batches), which would make a sequence's logits depend on
its batch (bench/RESULTS.md, "Figures behind the kernels' shape"). Their few and many rows
stay float32.

Every row is quantized on its own and multiplied the same way alone, in a batch or in a prefill
(dispatch.py sends every row count of a K-quant with int8 rows here), so a row's result does
not depend on the rows beside it: the same bits (`k_tail`).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.numba.ilanes import (
    bbits, bhigh, bload, fhigh4, flane8, fma8, fmul8, fquad8, fsplat8, fzero8, hload, iadd, ifloat,
    isums8, izero, kscales, maddubs, maddwd, vamax, vrint, vstore_i8, wbytes, wpair, wsplat,
)
from inferno.backends.numba.dense import FAST
from inferno.backends.numba.lanes import f16at, prefetch, sfma, vfma, vload, vmul, vsplat, vstore, vsum

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)
# For the per-block helpers: Numba compiles each jitted function on its own and leaves inlining to
# LLVM, which declined q6k_unit (its size): every super-block then paid a call that pushed ~40
# words of array arguments and returned its vectors through memory. Inlined in Numba's IR instead.
inline = nb.njit(cache=True, nogil=True, fastmath=FAST, inline="always")

QK = 256  # activations per scale, and weights per K-quant super-block
Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES = 144, 176, 210


# -- the activation rows -------------------------------------------------------------------------------
SUMS = 32  # int16 sums per unit of 256 activations (`quantize_rows`)


@jit
def empty():
    """The quantized activations of no rows: what the drivers pass where none are needed."""
    return (np.empty((0, 0), np.int8), np.empty((0, 0), np.int8), np.empty((0, 0), np.float32),
            np.empty((0, 0), np.float32), np.empty((0, 0), np.int16))


@jit
def quantize_rows(x, x8, r8, dx, dr, isum, b0, b1):
    """Rows b0..b1 of x [B, n] (n a multiple of 32) as int8 rows with a scale per unit of 256
    values (the last unit of a row may be shorter): x ~ dx * x8 + dr * r8, x8 = round(x / dx)
    with dx = max|x| / 127 over the unit (ggml's Q8_K), and r8 the same of what that leaves,
    x - dx * x8 (at most dx / 2 a value). Without a remainder (dr of no rows) only x8 is
    written.

    isum [B, SUMS * units] (twice that with a remainder, r8's after x8's): per unit, 32 int16
    sums of the unit's int8 values: lanes 0-7 zero, lane 8 + g the sum over group g (32 values),
    lane 16 + s over run s (16 values). The zeros line the groups' sums up with the mins in a
    Q4_K super-block's unpacked scales (ilanes.kscales: 8 scales, then 8 mins), so one maddwd
    multiplies the mins by them; Q6_K's 16 scales meet the runs' sums the same way. Integers,
    so the offsets' sums are exact in any kernel and any order (`k_tail`)."""
    n = x.shape[1]
    units = dx.shape[1]
    two = dr.shape[0] > 0
    res = np.empty(QK, np.float32)
    for b in range(b0, b1):
        for u in range(units):
            o = b * n + QK * u
            runs = min(QK, n - QK * u) // 16
            amax = np.float32(0.0)
            for i in range(runs):
                amax = max(amax, vamax(vload(x, o + 16 * i)))
            d = amax / np.float32(127.0)
            dx[b, u] = d
            inv = vsplat(np.float32(127.0) / amax if amax > 0 else np.float32(0.0))
            rmax = np.float32(0.0)
            for i in range(SUMS):
                isum[b, SUMS * u + i] = 0
            for i in range(runs):
                v = vload(x, o + 16 * i)
                q = vrint(vmul(v, inv))
                vstore_i8(x8, o + 16 * i, q)
                _add_run(isum, b, SUMS * u, i, vsum(q))  # a sum of integers: exact
                if two:
                    r = vfma(q, vsplat(-d), v)
                    vstore(res, 16 * i, r)
                    rmax = max(rmax, vamax(r))
            if two:
                e = rmax / np.float32(127.0)
                dr[b, u] = e
                rinv = vsplat(np.float32(127.0) / rmax if rmax > 0 else np.float32(0.0))
                at = SUMS * (units + u)
                for i in range(SUMS):
                    isum[b, at + i] = 0
                for i in range(runs):
                    q = vrint(vmul(vload(res, 16 * i), rinv))
                    vstore_i8(r8, o + 16 * i, q)
                    _add_run(isum, b, at, i, vsum(q))


@inline
def _add_run(isum, b, at, i, total):
    """Run i's sum (an integer as float32) into its lane and its group's (see quantize_rows)."""
    t = np.int16(total)
    isum[b, at + 16 + i] = t
    isum[b, at + 8 + i // 2] += t


@jit
def buffers(B, n, two):
    """Room for B rows of n activations quantized: (x8, r8, dx, dr, isum), quantize_rows' arrays
    (r8 and dr of no rows unless two)."""
    units = (n + QK - 1) // QK
    m = B if two else 0
    return (np.empty((B, n), np.int8), np.empty((m, n), np.int8), np.empty((B, units), np.float32),
            np.empty((m, units), np.float32), np.empty((B, SUMS * units * (2 if two else 1)), np.int16))


@jit
def quantize(x, two):
    """x [B, n] -> (x8, r8, dx, dr, isum) as quantize_rows writes them (r8 and dr of no rows
    unless two)."""
    x8, r8, dx, dr, isum = buffers(x.shape[0], x.shape[1], two)
    quantize_rows(x, x8, r8, dx, dr, isum, np.int64(0), x.shape[0])  # (qkernels.chunk_start: why)
    return x8, r8, dx, dr, isum


# -- one order of arithmetic -----------------------------------------------------------------------------
# Every K-quant kernel (k_rows, k_few, qgemm's panels, kpanels') reduces a super-block of one weight
# row against one activation row to four integers, exact whatever the kernel's lanes:
#   s = sum_g sc_g (q . qx)_g,  t = the same against rx,  m = sum_g m_g (sum of qx over g),  n = the same of rx
# (Q6_K: its 16 int8 scales for both sc and m, over runs of 16), and adds them to the row's result
# in this order, one rounding each, never reassociated (lanes.sfma, vfma_exact, ilanes.fma8):
#   acc = fma(s, d dx, acc); acc = fma(t, d dr, acc); acc = fma(m, o dx, acc); acc = fma(n, o dr, acc)
# with o the offset's factor, Q4_K's and Q5_K's -dmin, Q6_K's -32 d. So a row's result is the same
# bits alone, in a batch or in a prefill, on any number of threads.
@inline
def k_tail(acc, v, lane, d, o, dxs, drs, two):
    """acc + one super-block of one row, its (s, t, m, n) in lanes lane.. of v (floats)."""
    acc = sfma(flane8(v, lane), d * dxs, acc)
    if two:
        acc = sfma(flane8(v, lane + 1), d * drs, acc)
    acc = sfma(flane8(v, lane + 2), o * dxs, acc)
    if two:
        acc = sfma(flane8(v, lane + 3), o * drs, acc)
    return acc


# -- Q4_K and Q5_K -------------------------------------------------------------------------------------
@jit
def q4k_quarter(lo, hi, x8, xo, sc, j):
    """Weights 64j..64j + 64 of a Q4_K or Q5_K super-block (lo: weights 0-31 as bytes, hi:
    32-63) against x8[xo:], each run of 32 times its 6-bit scale (lanes 2j and 2j + 1 of sc):
    8 int32 partial sums."""
    lo = maddwd(maddubs(lo, bload(x8, xo)), wsplat(sc, 2 * j))
    hi = maddwd(maddubs(hi, bload(x8, xo + 32)), wsplat(sc, 2 * j + 1))
    return iadd(lo, hi)


@inline
def q4k_unit(ub, f, o, x8, r8, isum, b, u, two):
    """The Q4_K (ub = Q4_K_BYTES) or Q5_K super-block at byte o against super-block u of
    activation row b: (s, t, m, n) as 8 int32 lanes each (see `k_tail`), and (d, -dmin)."""
    n = x8.shape[1]
    sc = kscales(f, o + 4)  # [8 scales, 8 mins]
    at = b * isum.shape[1] + SUMS * u
    m = maddwd(sc, hload(isum, at))  # the sums' lanes 0-7 are zero: the mins meet the groups' sums
    s, t = izero(), izero()
    xo = b * n + QK * u
    for j in range(4):
        if ub == Q5_K_BYTES:  # nibbles after 32 bytes of fifth bits: weight l of group g's is bit g of byte l
            qa, qh = bload(f, o + 48 + 32 * j), bload(f, o + 16)
            lo, hi = bhigh(bbits(qa, 0, 15), qh, 2 * j, 1), bhigh(bbits(qa, 4, 15), qh, 2 * j + 1, 1)
        else:
            qa = bload(f, o + 16 + 32 * j)
            lo, hi = bbits(qa, 0, 15), bbits(qa, 4, 15)
        s = iadd(s, q4k_quarter(lo, hi, x8, xo + 64 * j, sc, j))
        if two:
            t = iadd(t, q4k_quarter(lo, hi, r8, xo + 64 * j, sc, j))
    rm = maddwd(sc, hload(isum, at + isum.shape[1] // 2)) if two else izero()
    return s, t, m, rm, f16at(f, o), -f16at(f, o + 2)


# -- Q6_K ----------------------------------------------------------------------------------------------
@jit
def q6k_half(w0, w1, w2, w3, x8, xo, sc, h):
    """Weights 128h..128h + 128 of a Q6_K super-block (q6k_weights) against x8[xo:], each 16
    of them times its int8 scale (lanes 8h + 2t and 8h + 2t + 1 of sc)."""
    s0 = maddwd(maddubs(w0, bload(x8, xo)), wpair(sc, 8 * h))
    s1 = maddwd(maddubs(w1, bload(x8, xo + 32)), wpair(sc, 8 * h + 2))
    s2 = maddwd(maddubs(w2, bload(x8, xo + 64)), wpair(sc, 8 * h + 4))
    s3 = maddwd(maddubs(w3, bload(x8, xo + 96)), wpair(sc, 8 * h + 6))
    return iadd(iadd(s0, s1), iadd(s2, s3))


@jit
def q6k_weights(f, o, h):
    """The 128 weights 128h.. of the Q6_K super-block at byte o, in 0..63, as four runs of 32:
    run t is the low (t < 2) or high nibbles of bytes 64h + 32 (t % 2) of the 128 bytes of
    nibbles, with bits 2t..2t + 1 of bytes 32h of the 64 bytes of high bits above them."""
    ql0, ql1, qh = bload(f, o + 64 * h), bload(f, o + 64 * h + 32), bload(f, o + 128 + 32 * h)
    return (bhigh(bbits(ql0, 0, 15), qh, 0, 3), bhigh(bbits(ql1, 0, 15), qh, 2, 3),
            bhigh(bbits(ql0, 4, 15), qh, 4, 3), bhigh(bbits(ql1, 4, 15), qh, 6, 3))


@inline
def q6k_unit(f, o, x8, r8, isum, b, u, two):
    """As q4k_unit, for the Q6_K super-block at byte o: its offset's factor is -32 d."""
    n = x8.shape[1]
    sc = wbytes(f, o + 192, True)  # 16 int8 scales
    at = b * isum.shape[1] + SUMS * u + 16  # the runs' sums
    m = maddwd(sc, hload(isum, at))
    s, t = izero(), izero()
    xo = b * n + QK * u
    for h in range(2):
        w0, w1, w2, w3 = q6k_weights(f, o, h)
        s = iadd(s, q6k_half(w0, w1, w2, w3, x8, xo + 128 * h, sc, h))
        if two:
            t = iadd(t, q6k_half(w0, w1, w2, w3, r8, xo + 128 * h, sc, h))
    rm = maddwd(sc, hload(isum, at + isum.shape[1] // 2)) if two else izero()
    d = f16at(f, o + 208)
    return s, t, m, rm, d, np.float32(-32.0) * d


@inline
def k_unit(ub, f, o, x8, r8, isum, b, u, two):
    """The super-block at byte o of a Q4_K, Q5_K or Q6_K row (ub its bytes) against super-block
    u of activation row b: (s, t, m, n, d, o) for `k_tail`."""
    if ub == Q6_K_BYTES:
        return q6k_unit(f, o, x8, r8, isum, b, u, two)
    return q4k_unit(ub, f, o, x8, r8, isum, b, u, two)


# -- rows ----------------------------------------------------------------------------------------------
# Literals for the passes: activation rows per pass, and whether a remainder row comes too.
ONE, TWO_ROWS, FOUR = 1, 2, 4
YES, NO = True, False


@inline
def remainder_scale(a, b, u, two):
    """Activation row b's remainder scale in super-block u (zero without `two`)."""
    return a[b, u] if two else np.float32(0.0)


@jit
def k_rows(ub, w, x8, r8, dx, dr, isum, y, r0, r1):
    """y[r] = w[r] . x' for rows r0..r1 of w, of Q4_K, Q5_K or Q6_K (ub: Q4_K_BYTES..), x' the
    one activation row quantize_rows wrote. ub a literal: each kind compiles its own loops."""
    if dr.shape[0] > 0:
        _k_rows(ub, YES, w, x8, r8, dx, dr, isum, y, r0, r1)
    else:
        _k_rows(ub, NO, w, x8, r8, dx, dr, isum, y, r0, r1)


@jit
def _k_rows(ub, two, w, x8, r8, dx, dr, isum, y, r0, r1):
    """k_rows with `two` a literal: no branch on it is left in the loop (its branches in the
    inlined helpers also kept Numba from pruning their arrays' reference counts: a call each
    per super-block, 3x the time)."""
    f = w.reshape(-1)
    rb = w.shape[1]
    r = r0
    while r < r1:
        ra, rc = r * rb, min(r + 1, r1 - 1) * rb  # an odd last row is paired with itself
        a, c = np.float32(0.0), np.float32(0.0)
        for u in range(rb // ub):
            p = rc + rb + 2 * ub * u  # the next pass's bytes, 2 ub a super-block
            for k in range((2 * ub + 63) // 64):
                prefetch(f, p + 64 * k)
            sa, ta, ma, na, da, oa = k_unit(ub, f, ra + ub * u, x8, r8, isum, 0, u, two)
            sc, tc, mc, nc, dc, oc = k_unit(ub, f, rc + ub * u, x8, r8, isum, 0, u, two)
            v = ifloat(isums8(sa, ta, ma, na, sc, tc, mc, nc))
            dxs, drs = dx[0, u], remainder_scale(dr, 0, u, two)
            a = k_tail(a, v, 0, da, oa, dxs, drs, two)
            c = k_tail(c, v, 4, dc, oc, dxs, drs, two)
        y[r] = a
        if r + 1 < r1:
            y[r + 1] = c
        r += 2


ROWS_PER_BLOCK = 16  # weight rows the passes over activation rows share at a time (in L1)


@jit
def k_few(ub, w, x8, r8, dx, dr, isum, out, r0, r1):
    """out[b, r] = w[r] . x'[b] for rows r0..r1 of w and each of a few activation rows b: four
    per pass over each weight row (then two, then one), its super-blocks unpacked once for all
    of them. The weight rows go by in chunks that every pass reads while they sit in L1. Each
    pass compiles with its row count and remainder as literals, so no branch on them is left
    in the loop over super-blocks (a runtime count there ran at a third of the speed)."""
    B = x8.shape[0]
    two = dr.shape[0] > 0
    for c0 in range(r0, r1, ROWS_PER_BLOCK):
        c1 = min(c0 + ROWS_PER_BLOCK, r1)
        b = np.int64(0)  # (a literal 0 would have typed, and compiled, a pass for b = 0 as well)
        while b + 4 <= B:
            _k_pass(ub, FOUR, two, w, b, x8, r8, dx, dr, isum, out, c0, c1)
            b += 4
        if b + 2 <= B:
            _k_pass(ub, TWO_ROWS, two, w, b, x8, r8, dx, dr, isum, out, c0, c1)
            b += 2
        if b < B:
            _k_pass(ub, ONE, two, w, b, x8, r8, dx, dr, isum, out, c0, c1)


@jit
def _k_pass(ub, rows, two, w, b, x8, r8, dx, dr, isum, out, r0, r1):
    """_k_block with `two` made a literal too (rows already is one)."""
    if two:
        _k_block(ub, rows, YES, w, b, x8, r8, dx, dr, isum, out, r0, r1)
    else:
        _k_block(ub, rows, NO, w, b, x8, r8, dx, dr, isum, out, r0, r1)


@inline
def _k_quad(ub, f, o, x8, r8, dx, dr, isum, b, u, two, rows, acc):
    """acc (lane i: activation row b + i's result) + the super-block at byte o against
    activation rows b..b + rows (1, 2 or 4): their integers reduced into lanes, four rows a
    vector, and k_tail's four terms added lane by lane (the other lanes compute zeros)."""
    z = izero()
    s0, t0, m0, n0, d, off = k_unit(ub, f, o, x8, r8, isum, b, u, two)
    s1, t1, m1, n1 = z, z, z, z
    s2, t2, m2, n2 = z, z, z, z
    s3, t3, m3, n3 = z, z, z, z
    if rows >= 2:
        s1, t1, m1, n1, d, off = k_unit(ub, f, o, x8, r8, isum, b + 1, u, two)
    if rows == 4:
        s2, t2, m2, n2, d, off = k_unit(ub, f, o, x8, r8, isum, b + 2, u, two)
        s3, t3, m3, n3, d, off = k_unit(ub, f, o, x8, r8, isum, b + 3, u, two)
    i1, i2, i3 = min(b + 1, b + rows - 1), min(b + 2, b + rows - 1), min(b + 3, b + rows - 1)
    dxs = fquad8(dx[b, u], dx[i1, u], dx[i2, u], dx[i3, u])
    dd, oo = fsplat8(d), fsplat8(off)
    if two:
        drs = fquad8(dr[b, u], dr[i1, u], dr[i2, u], dr[i3, u])
        st = ifloat(isums8(s0, s1, s2, s3, t0, t1, t2, t3))
        mn = ifloat(isums8(m0, m1, m2, m3, n0, n1, n2, n3))
        acc = fma8(st, fmul8(dd, dxs), acc)
        acc = fma8(fhigh4(st), fmul8(dd, drs), acc)
        acc = fma8(mn, fmul8(oo, dxs), acc)
        return fma8(fhigh4(mn), fmul8(oo, drs), acc)
    sm = ifloat(isums8(s0, s1, s2, s3, m0, m1, m2, m3))
    acc = fma8(sm, fmul8(dd, dxs), acc)
    return fma8(fhigh4(sm), fmul8(oo, dxs), acc)


@jit
def _k_block(ub, rows, two, w, b, x8, r8, dx, dr, isum, out, r0, r1):
    """Weight rows r0..r1 against activation rows b..b + rows (rows 1, 2 or 4)."""
    f = w.reshape(-1)
    rb = w.shape[1]
    for r in range(r0, r1):
        acc = fzero8()
        for u in range(rb // ub):
            acc = _k_quad(ub, f, r * rb + ub * u, x8, r8, dx, dr, isum, b, u, two, rows, acc)
        for i in range(rows):
            out[b + i, r] = flane8(acc, i)
