"""dispatch.py: which kernel multiplies a weight by how many activation rows. Its test is its
table: each line a product (kind, rows, columns, the backend's activation mode and legacy
flag) and the kernel that must take it, on this CPU's thresholds. A last test follows the
table into the drivers: a product computed through the backend equals the one the named
kernel computes when called directly. (The kernels of one line of the table agree bit for bit,
so that pins the drivers to the table's line, its activations and arithmetic, rather than to
one kernel of the line.)"""

from __future__ import annotations

import numba as nb
import numpy as np
import pytest

from inferno.backends.numba import dispatch, fdot, kpanels, ldot, lgemm, lpanels, qdot, qgemm
from inferno.backends.numba.dispatch import FEW_MAX, GEMM_MIN, GEMM_MIN_COLS, LEGACY_FEW
from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.simd import SimdBackend
from tests.qblocks import kernel_call, random_blocks

WIDE = max(GEMM_MIN_COLS, 256)  # columns past the panels' minimum width on every CPU
NARROW = 256  # below it where it is 1024 (VNNI in 256 bits), else the same

TABLE = [
    # kind, rows, cols, mode, legacy -> kernel
    ("Q4_1", 1, WIDE, 1, True, "ldot.l_rows"),
    ("Q8_0", LEGACY_FEW, WIDE, 1, True, "ldot.l_rows"),
    ("Q8_0", LEGACY_FEW + 1, WIDE, 1, True, "lgemm.l_gemm"),
    ("Q5_0", 512, WIDE, 1, True, "lgemm.l_gemm"),
    ("Q4_0", 1, WIDE, 0, False, "qkernels.matvec_rows"),  # legacy kinds in float32
    ("Q4_0", FEW_MAX, WIDE, 0, False, "qkernels.few_rows"),
    ("Q4_0", FEW_MAX + 1, WIDE, 0, False, "qkernels.prefill_rows"),
    ("MXFP4", 1, WIDE, 1, True, "ldot.l_rows"),  # a legacy kind
    ("MXFP4", LEGACY_FEW + 1, WIDE, 2, True, "lgemm.l_gemm"),
    ("MXFP4", 1, WIDE, 1, False, "qkernels.matvec_rows"),  # no int8 rows: float32 unless int16
    ("MXFP4", 512, WIDE, 0, False, "qkernels.prefill_rows"),
    ("MXFP4X16", 1, WIDE, 1, True, "ldot.l_rows"),  # in panels: l_rows' share is lpanels.m_rows
    ("MXFP4X16", LEGACY_FEW, WIDE, 1, True, "ldot.l_rows"),
    ("MXFP4X16", LEGACY_FEW + 1, WIDE, 1, True, "lgemm.l_gemm"),
    ("Q4_1X16", 1, WIDE, 1, True, "ldot.l_rows"),
    ("Q4_0X16", LEGACY_FEW + 1, WIDE, 1, True, "lgemm.l_gemm"),
    ("Q4_K", 1, WIDE, 1, False, "qdot.k_rows"),
    ("Q6_K", 1, WIDE, 2, True, "qdot.k_rows"),  # the legacy flag is the legacy kinds' only
    ("Q5_K", 2, WIDE, 1, False, "qdot.k_few"),
    ("Q4_K", GEMM_MIN - 1, WIDE, 2, False, "qdot.k_few"),
    ("Q4_K", GEMM_MIN, WIDE, 1, False, "qgemm.k_gemm"),
    ("Q6_K", 512, WIDE, 2, False, "qgemm.k_gemm"),
    ("Q4_K", 1, WIDE, 0, False, "qkernels.matvec_rows"),  # K-quants in float32
    ("Q4_K", 512, WIDE, 0, False, "qkernels.prefill_rows"),
    ("Q4_KX8", 1, WIDE, 1, False, "kpanels.p_rows"),
    ("Q4_KX8", GEMM_MIN - 1, WIDE, 1, False, "kpanels.p_rows"),
    ("Q4_KX8", 512, WIDE, 2, False, "kpanels.p_gemm"),
    ("F16", 1, WIDE, 1, True, "fdot.f_rows"),  # float weights: one kernel, whatever the rows
    ("BF16", 4, WIDE, 0, False, "fdot.f_rows"),
    ("F16", 512, WIDE, 1, True, "fdot.f_rows"),
    ("F32", 1, WIDE, 0, False, "fdot.f_rows"),
    ("F32", 512, WIDE, 1, True, "fdot.f_rows"),
]


@nb.njit
def _compiled(kind, rows, cols, mode, legacy):
    """dispatch.kernel compiled, as the jitted drivers take it."""
    return dispatch.kernel(kind, rows, cols, mode, legacy)


@pytest.mark.parametrize("kind, rows, cols, mode, legacy, expected", TABLE,
                         ids=[f"{k}-{r}rows-mode{m}{'-legacy' if lg else ''}" for k, r, _, m, lg, _ in TABLE])
def test_the_table(kind, rows, cols, mode, legacy, expected):
    code = int(WeightKind[kind])
    assert dispatch.kernel_name(code, rows, cols, mode, legacy) == expected
    assert dispatch.NAMES[_compiled(code, rows, cols, mode, legacy)] == expected  # as the drivers run it


def test_the_thresholds_follow_the_cpu():
    """The panels' minimum rows and width are the CPU's: 16 rows at any width with AVX-512 or
    without VNNI, 32 rows of 1024 columns where VNNI is 256 bits wide."""
    if qgemm.WIDE or qgemm.DEEP:
        assert (GEMM_MIN, GEMM_MIN_COLS) == (16, 0)
    else:
        assert (GEMM_MIN, GEMM_MIN_COLS) == (32, 1024)
        code = int(WeightKind["Q4_K"])
        assert dispatch.kernel_name(code, 512, NARROW, 1, False) == "qdot.k_few"
    assert GEMM_MIN >= qgemm.GEMM_ROWS_MIN  # the panels' passes need that many rows


def test_activation_modes():
    """The backend's mode: float32 when it takes no int8 rows, panels excepted; two rows for
    inputs with outliers."""
    w = random_blocks("Q4_K", 8, 256)
    assert dispatch.activation_mode(False, w) == 0
    assert dispatch.activation_mode(True, w) == 1
    w.outlier_inputs = True
    assert dispatch.activation_mode(True, w) == 2
    assert dispatch.activation_mode(False, kpanels.repack(random_blocks("Q4_K", 8, 256))) == 1


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("kinds", [["Q4_K", "Q6_K"], ["Q8_0", "Q4_K"], ["Q4_1"], ["F16", "BF16"]])
def test_shared_launch_is_the_tables_answer(kinds, legacy):
    """One launch for weights sharing an input exactly where the table sends none of them
    through lgemm's GEMM, up to FEW_MAX rows."""
    codes = [int(WeightKind[k]) for k in kinds]
    for rows in (1, LEGACY_FEW, LEGACY_FEW + 1, FEW_MAX, FEW_MAX + 1):
        ways = [dispatch.kernel(c, rows, WIDE, 1, legacy) for c in codes]
        assert dispatch.shared_launch(rows, codes, legacy) == (rows <= FEW_MAX and dispatch.L_GEMM not in ways)
        assert dispatch.lgemm_rows(rows, legacy) == (dispatch.kernel(int(WeightKind["Q8_0"]), rows, WIDE, 1, legacy)
                                                     == dispatch.L_GEMM)


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_a_shared_launch_takes_two_kernels_a_kind(mode, legacy):
    """shared_ways names the kernels a weight can take in a shared launch, one for a row and
    one for more, in launches of gemm_size or not, at any width: linear_many's entries compile
    those two alone."""
    for kind in WeightKind:
        for rows in (r for r in range(1, FEW_MAX + 1) if dispatch.shared_launch(r, [int(kind)], legacy)):
            for cols in (32, NARROW, WIDE, 1 << 16):
                one, few = dispatch.shared_ways(int(kind), mode, legacy, dispatch.gemm_size(rows, cols))
                assert dispatch.kernel(int(kind), rows, cols, mode, legacy) == (one if rows == 1 else few)


def _direct(name, w, x, two):
    """The named kernel called directly on x's rows (as the drivers call it)."""
    out = np.zeros((x.shape[0], w.shape[0]), np.float32)
    if name == "fdot.f_rows":
        kind, data = (WeightKind.F32, w.view(np.uint8)) if isinstance(w, np.ndarray) else (WeightKind.of(w), w.data)
        kernel_call(fdot.f_rows, int(kind), sliced=True)(data, (x,), out, 0, w.shape[0])
        return out
    if name.startswith("ldot") or name.startswith("lgemm"):
        kernel = ldot.l_rows if name == "ldot.l_rows" else lgemm.l_gemm
        kernel_call(kernel, int(WeightKind.of(w)))(w.data, ldot.quantized(x), out, 0, w.shape[0])
        return out
    xq = qdot.quantize(x, two)
    if name.startswith("kpanels"):
        kernel_call(kpanels.p_rows if name == "kpanels.p_rows" else kpanels.p_gemm, sliced=True)(
            w.data, xq, out, 0, w.shape[0])
        return out
    ub = {"Q4_K": qdot.Q4_K_BYTES, "Q5_K": qdot.Q5_K_BYTES, "Q6_K": qdot.Q6_K_BYTES}[w.qtype.name]
    if name == "qdot.k_rows":
        kernel_call(qdot.k_rows, ub)(w.data, xq, out[0], 0, w.shape[0])
    else:
        kernel_call(qdot.k_few if name == "qdot.k_few" else qgemm.k_gemm, ub, sliced=True)(
            w.data, xq, out, 0, w.shape[0])
    return out


@pytest.mark.parametrize("kind", ["Q4_1", "MXFP4", "MXFP4X16", "Q4_K", "Q6_K", "Q4_KX8", "BF16", "F32"])
def test_the_backend_takes_the_tables_kernel(kind):
    """simd.linear's result for 1, a few and many rows equals, bit for bit, the kernel the table
    names for that product, called directly."""
    ops = SimdBackend()
    if kind not in ("BF16", "F32") and (not ops.int8_activations or (kind in ("Q4_1", "MXFP4", "MXFP4X16") and not ops._legacy)):
        pytest.skip("this CPU takes these kinds' activations in float32")
    if kind == "F32":
        w = ops.weight(np.random.default_rng(5).standard_normal((48, WIDE)).astype(np.float32))
    else:
        w = random_blocks(kind.replace("X8", "").replace("X16", ""), 48, WIDE, seed=5)
    if kind == "Q4_KX8":
        w = kpanels.repack(w)
    if kind == "MXFP4X16":
        w = lpanels.repack(w)
    rng = np.random.default_rng(0)
    for rows in (1, 2, LEGACY_FEW + 1, GEMM_MIN, 40):
        x = rng.standard_normal((rows, WIDE)).astype(np.float32)
        code = int(WeightKind.F32) if kind == "F32" else int(WeightKind.of(w))
        name = dispatch.kernel_name(code, rows, WIDE, 0 if kind == "F32" else ops._int8_mode(w), ops._legacy)
        np.testing.assert_array_equal(ops.linear(x, w), _direct(name, w, x, False), err_msg=f"{rows} rows: {name}")
    ops.close()


@pytest.mark.parametrize("backend", ["simd", "pool"])
def test_a_float_weight_not_float32_is_refused(backend):
    """fdot reads a float matrix's bytes as float32 without bounds checks: a float64 or float16
    array handed to linear without backend.weight() is refused in one clear error, not read past
    its end; one of the wrong width too."""
    from inferno.backends import create_backend
    ops = create_backend(backend)
    x = np.ones((3, 32), np.float32)
    try:
        for dtype in (np.float64, np.float16):
            with pytest.raises(ValueError, match=r"must be float32 \(backend.weight\(w\)\)"):
                ops.linear(x, np.ones((8, 32), dtype))
        with pytest.raises(ValueError, match="x has 32 columns, the weight 48"):
            ops.linear(x, ops.weight(np.ones((8, 48), np.float32)))
        np.testing.assert_array_equal(ops.linear(x, ops.weight(np.ones((8, 32), np.float32))), np.full((3, 8), 32.0))
    finally:
        ops.close()
