"""Q8_0 and Q4_0 blocks of float32 rows, bit for bit as the gguf package makes them (ports of
ggml's reference quantizers): for `--weights` (qkernels.quantize runs these over all rows on the
team) and for the KV cache's Q8_0 rows (kv_kernels.py). A file of their own, importing nothing of
the linears: the cache's kernels are then keyed on this, not on every linear kernel
(jitcache.sources_key).

No fastmath here: every rounding must be the one numpy makes.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from inferno.backends.numba import jitcache  # noqa: F401  first: where the kernels below are cached
from inferno.backends.numba.lanes import f16bits


@nb.njit(cache=True, nogil=True)
def _put_f16(out, r, o, v):
    bits = f16bits(v)
    out[r, o], out[r, o + 1] = bits & 255, bits >> 8


@nb.njit(cache=True, nogil=True)
def quantize_q8_0(w, out, r0, r1):
    """Q8_0 blocks of float32 rows r0..r1 of w [rows, cols] into out [rows, cols // 32 * 34]:
    d = max|x| / 127, q = x / d rounded half away from zero (gguf's np_roundf, step by step)."""
    q = np.empty(32, np.float32)
    for r in range(r0, r1):
        for b in range(w.shape[1] // 32):
            c = 32 * b
            amax = np.float32(0.0)
            for i in range(32):
                amax = max(amax, abs(w[r, c + i]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            for i in range(32):
                v = w[r, c + i] * inv
                a = abs(v)
                fl = np.floor(a)
                q[i] = np.copysign(fl + np.floor(np.float32(2.0) * (a - fl)), v)
            o = 34 * b
            _put_f16(out, r, o, d)
            for i in range(32):
                out[r, o + 2 + i] = np.uint8(np.int8(q[i]))


@nb.njit(cache=True, nogil=True)
def quantize_q4_0(w, out, r0, r1):
    """Q4_0 blocks of float32 rows r0..r1 of w [rows, cols] into out [rows, cols // 32 * 18]:
    d = the weight of largest magnitude / -8, q = trunc(x / d + 8.5) clipped to 15."""
    for r in range(r0, r1):
        for b in range(w.shape[1] // 32):
            x = w[r, 32 * b:32 * b + 32]
            vmax, amax = np.float32(0.0), np.float32(-1.0)
            for i in range(32):
                if abs(x[i]) > amax:  # the first of equal magnitudes, as argmax
                    amax, vmax = abs(x[i]), x[i]
            d = vmax / np.float32(-8.0)
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            o = 18 * b
            _put_f16(out, r, o, d)
            for i in range(16):
                lo = min(np.int64(np.trunc(x[i] * inv + np.float32(8.5))), 15)
                hi = min(np.int64(np.trunc(x[i + 16] * inv + np.float32(8.5))), 15)
                out[r, o + 2 + i] = lo | (hi << 4)
