"""Numba kernels for the dense ops of the simd and pool backends: GEMM rows (the materialized
reference's matmul; a linear's products are fdot.py's and the quantized kernels'), RMSNorm,
RoPE, SwiGLU, softmax, scale and mask, and the exp they share with attention (attention.py).

Every kernel is serial, compiled to machine code once (`cache=True`: a fresh checkout compiles on
first use, later runs load from inferno's kernel cache, jitcache.py) and releases the GIL
(`nogil=True`). Each works on a range of rows and writes only its own part of a preallocated
output, so the pool backend runs these very kernels side by side, one range per job.

fastmath is limited to FAST: reassociation and contraction let LLVM vectorise sums and fuse
multiply-adds, reordering float32 rounding as BLAS does. The no-NaN/no-inf flags stay off:
masked scores are -inf, and a kernel must not assume them away.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from inferno.backends.numba import jitcache  # noqa: F401  first: where the kernels below are cached

FAST = {"reassoc", "contract", "arcp", "nsz"}

jit = nb.njit(cache=True, nogil=True, fastmath=FAST)


# Cephes' single-precision exp: exp(x) = 2^k * exp(r), |r| <= ln2 / 2, degree-5 polynomial.
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_MIN = np.float32(-87.33)  # below this exp(x) is under float32's smallest normal: 0
_EXP_MAX = np.float32(88.0)  # 2^k stays a normal float32 (k <= 127)


@jit
def exp_into(x, out, bits, n):
    """out[:n] = exp(x[:n]), to 2e-7 relative, in a loop LLVM vectorises (Numba's np.exp calls
    scalar libm: 1.7 ns per element here, this 0.2 ns). `bits` is int32 scratch of length >= n.
    -inf gives 0, so masked scores drop out; NaN stays NaN."""
    for j in range(n):
        xv = min(max(x[j], _EXP_MIN), _EXP_MAX)
        k = np.floor(xv * _LOG2E + np.float32(0.5))
        r = xv - k * _LN2_HI - k * _LN2_LO
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        out[j] = p * r * r + r + np.float32(1.0)
        bits[j] = (np.int32(k) + np.int32(127)) << np.int32(23)  # 2^k as float32 bits
    two_k = bits.view(np.float32)
    for j in range(n):
        out[j] = np.float32(0.0) if x[j] < _EXP_MIN else out[j] * two_k[j]  # NaN stays NaN


# -- dense kernels: rows r0..r1 ------------------------------------------------------------------
@jit
def gemm_rows(a, b, out, r0, r1):
    """out[r0:r1] = a[r0:r1] @ b through BLAS (scipy's sgemm via Numba's np.dot); b may be a
    transposed [out, in] weight, which BLAS reads as is."""
    if r1 > r0:
        np.dot(a[r0:r1], b, out[r0:r1])


@jit
def rms_norm_rows(x, w, eps, out, r0, r1):
    """RMSNorm over each group of len(w) features of rows r0..r1 (a whole row, or each head)."""
    g = w.shape[0]
    eps32 = np.float32(eps)
    for r in range(r0, r1):
        for c0 in range(0, x.shape[1], g):
            xs, ys = x[r, c0:c0 + g], out[r, c0:c0 + g]
            ss = np.float32(0.0)
            for d in range(g):
                ss += xs[d] * xs[d]
            inv = np.float32(1.0) / np.sqrt(ss / np.float32(g) + eps32)
            for d in range(g):
                ys[d] = xs[d] * inv * w[d]


@jit
def rope_rows(x, cos, sin, head_dim, out, r0, r1):
    """Rotate-half RoPE on every head of rows r0..r1; cos/sin [rows, head_dim // 2]."""
    half = head_dim // 2
    for r in range(r0, r1):
        c, s = cos[r], sin[r]
        for c0 in range(0, x.shape[1], head_dim):
            x1, x2 = x[r, c0:c0 + half], x[r, c0 + half:c0 + head_dim]
            y1, y2 = out[r, c0:c0 + half], out[r, c0 + half:c0 + head_dim]
            for d in range(half):
                y1[d] = x1[d] * c[d] - x2[d] * s[d]
                y2[d] = x2[d] * c[d] + x1[d] * s[d]


# (c, k) of glu_rows for each activation.
SILU = (np.float32(-1.0), np.float32(0.0))
GELU_TANH = (np.float32(-2.0 * math.sqrt(2.0 / math.pi)), np.float32(0.044715))


@jit
def glu_rows(gate, up, c, k, out, r0, r1):
    """Gated linear units act(gate) * up on rows r0..r1, for the activations of the form
    g / (1 + exp(c (g + k g^3))): SiLU (SILU: g sigmoid(g)) and GELU's tanh approximation
    (GELU_TANH: 0.5 g (1 + tanh(z)) is g sigmoid(2z), z = sqrt(2/pi) (g + 0.044715 g^3)), so
    both take the one exp."""
    n = gate.shape[1]
    a = np.empty(n, np.float32)
    e = np.empty(n, np.float32)
    bits = np.empty(n, np.int32)
    for r in range(r0, r1):
        g, u, y = gate[r], up[r], out[r]
        if k == 0:  # SiLU: no cube (an infinite gate stays one)
            for j in range(n):
                a[j] = c * g[j]
        else:
            for j in range(n):
                x = g[j]
                a[j] = c * (x + k * x * x * x)
        exp_into(a, e, bits, n)
        for j in range(n):
            y[j] = g[j] / (np.float32(1.0) + e[j]) * u[j]


@jit
def softmax_rows(x, out, r0, r1):
    n = x.shape[1]
    shifted = np.empty(n, np.float32)
    bits = np.empty(n, np.int32)
    for r in range(r0, r1):
        xs, ys = x[r], out[r]
        mx = xs[0]
        for j in range(1, n):
            mx = max(mx, xs[j])
        for j in range(n):
            shifted[j] = xs[j] - mx
        exp_into(shifted, ys, bits, n)
        total = np.float32(0.0)
        for j in range(n):
            total += ys[j]
        for j in range(n):
            ys[j] = ys[j] / total


@jit
def scale_rows(x, s, out, r0, r1):
    s32 = np.float32(s)
    for r in range(r0, r1):
        xs, ys = x[r], out[r]
        for j in range(x.shape[1]):
            ys[j] = xs[j] * s32


@jit
def fill_upper_rows(x, value, offset, out, r0, r1):
    """Rows r0..r1 of x with every element right of column row + offset set to value."""
    v32 = np.float32(value)
    for r in range(r0, r1):
        first = max(0, min(r + offset + 1, x.shape[1]))
        for c in range(first):  # (a loop: a slice assignment's shape check compiles its message)
            out[r, c] = x[r, c]
        out[r, first:] = v32
