"""Random GGML blocks built byte by byte, for the quantized-kernel tests and benchmarks; and what
a product with them must equal.

Every byte of a block is random except its float16 scale fields, which are set to finite values
(GGUF files hold no inf or NaN scales): random ones, zeros, the extremes of float16 (65504, the
smallest normal and subnormal), negative mins. MXFP4's scale byte e (2^(e - 128)) is set likewise,
around 2^-5, a quarter at 2^-88 or 2^32 (not e 0, 1 or 255: scales so small that d dx is subnormal
in the int16 kernels, or weights that overflow, are tests/test_quant.py's, on the decoders alone).
Quant bytes run through all 256 values, so every nibble and every sign occurs.

The reference for a product is the gguf package's dequantisation followed by a float64 matmul.
With float32 activations a kernel agrees within float32 rounding: the error of each output,
relative to sum(|w| |x|) over its row, stays under 1e-7 x sqrt(cols) (float32's unit roundoff is
6e-8; summation order differs, as in BLAS), with |w| taken as |d q| + |m| for the legacy kinds
whose blocks have an offset m (`offsets`: the kernels add up d q x and m x apart). Products of
Q4_K, Q5_K and Q6_K weights may take int8 activations (qdot.py; the backends' int8_activations): per row
ggml's Q8_K, scale dx per 256 values (a row's last unit may be shorter), plus for weights whose
inputs carry outliers (outlier_inputs: o_proj, down_proj) a second int8 row for its remainder,
scale dr. Such a product is pinned twice: to the reference run on the dequantised activations,
within float32 rounding as above; and to the reference on the float32 activations within what
rounding them may cost, sum over the row of |w_i| d_i / 2 (each activation moves by at most
half a step of its unit's last scale d). Products of the legacy kinds (Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1, MXFP4) may take int16 activations (ldot.py; the backends' int16_legacy), a scale per block of
32: pinned the same two ways, with that scale for d.

The blocks are read-only, as the backends hand every weight to the kernels (simd's
quantized_weight), and `kernel_call` calls a kernel directly the way the drivers call it: a
kernel compiled for a writable weight, a kind typed int64 rather than as a constant, or an
output of another layout is a second compile of it for the tests alone (a minute each for the
K-quants' kernels).
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np

from inferno.backends.numba import ldot, qdot
from inferno.backends.numba import qkernels as Q
from inferno.backends.numba.codes import WeightKind
from inferno.formats.quant import QTYPES, QuantTensor

# Byte offsets of the float16 fields in each type's block (scales d, mins m, K-quants' dmin).
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
              "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
EXTREMES = np.array([0.0, 65504.0, -65504.0, 6.103515625e-05, 5.960464477539063e-08, -1.0],
                    dtype=np.float16)
E8M0_EXTREMES = np.array([40, 160], dtype=np.uint8)  # MXFP4 scales 2^-88, 2^32


def random_blocks(name: str, rows: int, cols: int, seed: int = 0, extremes: bool = True,
                  readonly: bool = True) -> QuantTensor:
    """A [rows, cols] QuantTensor of type `name` with random blocks (see the module docstring).
    `extremes` puts EXTREMES into a quarter of the scale fields."""
    qtype = QTYPES[name]
    rng = np.random.default_rng(seed)
    nblocks = rows * cols // qtype.block
    data = np.empty((nblocks, qtype.block_bytes), dtype=np.uint8)
    data.reshape(-1)[:] = rng.permutation(np.resize(np.arange(256, dtype=np.uint8), data.size))
    if name == "F16":
        data.view(np.float16)[:] = rng.standard_normal(data.view(np.float16).shape).astype(np.float16)
    elif name == "BF16":
        f32 = rng.standard_normal(nblocks).astype(np.float32)
        data.view(np.uint16)[:, 0] = (f32.view(np.uint32) >> 16).astype(np.uint16)
    for off in F16_FIELDS.get(name, ()):
        field = (rng.standard_normal(nblocks) * 0.05).astype(np.float16)
        if extremes:
            pick = rng.random(nblocks) < 0.25
            field[pick] = rng.choice(EXTREMES, pick.sum())
        data[:, off:off + 2] = field.view(np.uint8).reshape(nblocks, 2)
    if name == "MXFP4":  # the E8M0 byte e: 2^(e - 128), about 2^-5 (weights up to ~0.4)
        e = np.clip(np.rint(rng.standard_normal(nblocks) * 2 + 123), 0, 255).astype(np.uint8)
        if extremes:
            pick = rng.random(nblocks) < 0.25
            e[pick] = rng.choice(E8M0_EXTREMES, pick.sum())
        data[:, 0] = e
    data = data.reshape(rows, qtype.row_bytes(cols))
    if readonly:
        data.flags.writeable = False
    return QuantTensor(name, (rows, cols), data)


@functools.cache
def kernel_call(kernel, *constant, sliced: bool = False):
    """`call(w, activations, out, r0, r1)` runs kernel(*constant, w, *activations, out, r0, r1)
    as the drivers run it: `constant` (a kind, or a K-quant unit's bytes) a compile-time
    constant, as the drivers' closures make it, and out, where `sliced`, a slice of a buffer
    (rows_kernel writes out[:, col:], of no fixed layout). Called from Python, the constant
    would be typed int64, compiling a copy of the kernel with every kind's branches in it.
    (The wrapper is written out and exec'd so that the constants are its globals: Numba types
    a global int as a literal, a closure's variable as int64.)"""
    arity = {"qdot": 5, "qgemm": 5, "kpanels": 5, "ldot": 3, "lgemm": 3, "fdot": 1}[kernel.py_func.__module__.rsplit(".", 1)[-1]]
    names = ", ".join(f"a{i}" for i in range(arity))
    given = ", ".join(f"c{i}" for i in range(len(constant)))
    source = (f"def call(w, acts, out, r0, r1):\n"
              f"    {names}, = acts\n"
              f"    kernel({given}{', ' if given else ''}w, {names}, {'out[:, 0:]' if sliced else 'out'}, r0, r1)\n")
    scope = {"kernel": kernel, **{f"c{i}": c for i, c in enumerate(constant)}}
    exec(source, scope)
    return nb.njit(scope["call"])


def float_case(name: str):
    """A float weight of kind `name` (F32, F16, BF16) as the bytes fdot.f_rows reads, 37 rows
    (not a multiple of its passes), and 11 activation rows: F32 100 columns wide (six whole
    blocks of sixteen and four one by one), the 16-bit kinds 96."""
    cols = 100 if name == "F32" else 96
    if name == "F32":
        w = np.random.default_rng(5).standard_normal((37, cols)).astype(np.float32).view(np.uint8)
        w.flags.writeable = False
    else:
        w = random_blocks(name, 37, cols, seed=5).data
    return w, np.random.default_rng(6).standard_normal((11, cols)).astype(np.float32)


def width(name: str, blocks: int) -> int:
    """Columns of `blocks` whole blocks of type `name` (16-bit types: groups of 32)."""
    return blocks * max(QTYPES[name].block, 32)


def offsets(w: QuantTensor) -> np.ndarray:
    """Each weight's block offset m [rows, cols] (weight = d q + m) for the legacy kinds that
    have one (Q4_0: -8 d, Q5_0: -16 d, Q4_1 and Q5_1: their own); zero for the rest. The kernels
    sum d q x and m x apart (qkernels, ldot), so a weight of 0 = d q + m costs rounding of |m x|."""
    name = w.qtype.name
    if name not in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        return np.zeros(w.shape)
    blocks = w.data.reshape(-1, w.qtype.block_bytes)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)
    m = blocks[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float64) if name in ("Q4_1", "Q5_1") \
        else (-8.0 if name == "Q4_0" else -16.0) * d
    return np.repeat(m, 32).reshape(w.shape)


def magnitudes(w: QuantTensor) -> np.ndarray:
    """|w| as the kernels' rounding sees it: |d q| + |m| (`offsets`)."""
    dq = w.dequantize().astype(np.float64)
    m = offsets(w)
    return np.abs(dq - m) + np.abs(m)


def assert_rounding_close(got, x, w: QuantTensor):
    """got == x @ w.T within float32 rounding (see the module docstring)."""
    dq = w.dequantize().astype(np.float64)  # [rows, cols]
    x64 = x.astype(np.float64)
    want = x64 @ dq.T
    scale = np.abs(x64) @ magnitudes(w).T  # sum(|w| |x|) per output
    assert got.dtype == np.float32 and got.shape == want.shape
    err = np.abs(got - want) / np.maximum(scale, np.finfo(np.float32).tiny)
    tol = 1e-7 * np.sqrt(w.shape[1])
    assert err.max() <= tol, f"max error {err.max():.3g} x sum|w||x| (tolerance {tol:.3g})"


def int8_activations(x, two: bool):
    """x [B, cols] as the int8 kernels see it: (the dequantised rows, dx * x8 [+ dr * r8], [B,
    cols]; the last row's scale of each value's unit of 256, which bounds what is left, [B,
    cols])."""
    x8, r8, dx, dr, _ = qdot.quantize(x, two)
    unit = np.arange(x.shape[1]) // 256  # each value's unit (a row's last may be shorter)
    deq = x8 * dx[:, unit].astype(np.float64)
    if two:
        deq += r8 * dr[:, unit].astype(np.float64)
    return deq, (dr if two else dx)[:, unit]


def assert_int8_close(got, x, w: QuantTensor, two: bool):
    """got is x @ w.T computed from int8 activations (one row each, or two): within float32
    rounding of the reference on those, and within their rounding of the reference on x (see
    the module docstring)."""
    _assert_rounded_close(got, x, w, *int8_activations(x, two))


def _assert_rounded_close(got, x, w: QuantTensor, xq, step):
    """got within float32 rounding of the reference on the rounded activations xq, and within
    their rounding (step: each value's scale) of the reference on x."""
    assert_rounding_close(got, xq, w)
    dq = w.dequantize().astype(np.float64)  # [rows, cols]
    bound = step @ np.abs(dq).T / 2  # [B, rows]: sum_i |w_i| d_i / 2
    err = np.abs(got - x.astype(np.float64) @ dq.T)
    slack = 1e-7 * np.sqrt(w.shape[1]) * (np.abs(x.astype(np.float64)) @ magnitudes(w).T)  # float rounding
    assert (err <= bound + slack).all(), f"max error {(err / np.maximum(bound, 1e-300)).max():.3g} x sum|w| d / 2"


def int16_activations(x):
    """x [B, cols] as the legacy kinds' int16 kernels see it (ldot.py): (dx * x16, the scale of
    each value's block of 32), both [B, cols]."""
    x16, dx, _ = ldot.quantized(np.ascontiguousarray(x, dtype=np.float32))
    step = np.repeat(dx.astype(np.float64), 32, axis=1)
    return x16 * step, step


def assert_int16_close(got, x, w: QuantTensor):
    """got is x @ w.T computed from int16 activations: within float32 rounding of the reference
    on them, and within their rounding of the reference on x (see the module docstring)."""
    _assert_rounded_close(got, x, w, *int16_activations(x))


def activations_of(backend, w: QuantTensor) -> str:
    """How `backend` multiplies w's activations: "f32", "int8" (one row), "int8+r" (with its
    remainder row) or "int16" (the legacy kinds where its int16_legacy says so)."""
    kind = int(WeightKind.of(w))
    if not getattr(backend, "int8_activations", False):
        return "f32"
    if Q.int_dot(kind):
        return "int8+r" if backend._int8_mode(w) == 2 else "int8"
    if ldot.legacy(kind) and backend.int16_legacy:
        return "int16"
    return "f32"


def assert_matches(backend, got, x, w: QuantTensor):
    """got == x @ w.T as the kernel that ran promises: float32 rounding, or int8 or int16
    activations' (simd and pool only: the others have float32 activations)."""
    how = activations_of(backend, w)
    if how == "int16":
        assert_int16_close(got, x, w)
    elif how.startswith("int8"):
        assert_int8_close(got, x, w, how == "int8+r")
    else:
        assert_rounding_close(got, x, w)
