"""Which kernel multiplies a quantized weight by activation rows: the one table that the
drivers (qkernels.py), the experts (experts.py) and the backends (simd.py, pool.py) read, as
ggml's type traits are a table. It is the only code that compares row counts with thresholds
and turns the backend's settings into a kernel; the drivers take its answer and decide nothing
(they read the settings only to prepare the activations the kernel takes).

A product is a weight of some kind, B activation rows of `cols` values, on this CPU, with the
backend's two settings: `mode`, how the K-quants take activations (0: float32; 1: one int8
row each, ggml's Q8_K; 2: two, the second the first's remainder, for inputs with outliers),
and `legacy`, whether the legacy kinds take theirs as int16 rows. The answer (`kernel`):

    weight, activations          1 row              2 .. rows           many rows
    F32, F16, BF16 weights       fdot.f_rows (any number of rows: one order, one kernel)
    legacy kind, int16 rows      ldot.l_rows (up to LEGACY_FEW)   ->   lgemm.l_gemm   (MXFP4 is one)
    Q4_0/Q4_1/MXFP4 in panels    lpanels.m_rows (as l_rows)      ->   lgemm.l_gemm   (unpacks them)
    K-quant, int8 rows           qdot.k_rows        qdot.k_few     ->   qgemm.k_gemm (GEMM_MIN)
    Q4_K in panels (Q4_KX8)      kpanels.p_rows                    ->   kpanels.p_gemm (GEMM_MIN)
    quantized, float32 rows      qkernels.matvec_rows  few_rows    ->   prefill_rows (past FEW_MAX:
                                                                        dequantised tiles, sgemm)

Within each line but the last the kernels compute a row alike (the float weights' and the
legacy kinds' and the K-quants' one order of arithmetic: fdot.py, ldot.py, qdot.k_tail), so a
switch between them moves no result; the thresholds are about speed only. The last line, a
quantized weight against float32 activations, is taken only where the CPU lacks the integer
instructions (no AVX2) or the backend is told to keep float32: there a row's sum depends on its
company. The CPU enters through them: GEMM_MIN and GEMM_MIN_COLS depend on its
vector registers and VNNI (qgemm.DEEP, qgemm.WIDE), fixed when the kernels compile; whether
int8 and int16 rows are taken at all is the backend's (`mode`, `legacy`: `activation_mode`).
"""

from __future__ import annotations

from numba.extending import register_jitable

from inferno.backends.numba import ldot, qgemm
from inferno.backends.numba.codes import WeightKind
from inferno.backends.numba.kpanels import PanelTensor

F16, BF16, Q4_K, Q5_K, Q6_K, Q4_KX8, F32 = (int(WeightKind[k]) for k in
                                         ("F16", "BF16", "Q4_K", "Q5_K", "Q6_K", "Q4_KX8", "F32"))

# The kernels, by line of the table above.
L_ROWS, L_GEMM, K_ROWS, K_FEW, K_GEMM, P_ROWS, P_GEMM, F_ROW, F_FEW, F_TILES, F_DOT = range(11)
NAMES = ("ldot.l_rows", "lgemm.l_gemm", "qdot.k_rows", "qdot.k_few", "qgemm.k_gemm",
         "kpanels.p_rows", "kpanels.p_gemm", "qkernels.matvec_rows", "qkernels.few_rows",
         "qkernels.prefill_rows", "fdot.f_rows")

# Activation rows up to which the legacy kinds' l_rows beats lgemm's GEMM, whose packing of the
# weights costs more than a few rows save: a speculative check of up to 8 rows, or a batched
# step of up to 8 sequences, as whole steps of SmolLM2 and Gemma 3 (bench/RESULTS.md, "A
# cheaper check of a draft"). Either kernel gives the same bits: this is about speed only.
LEGACY_FEW = 8
# Activation rows up to which the quantized kinds' float32 row kernels (few_rows) beat dequantised
# tiles + sgemm.
FEW_MAX = 16
# Activation rows (and weight columns) from which qgemm's panels beat qdot.k_few, packing
# included, for every K-quant with and without remainder rows: with AVX-512 VNNI (zmm panels,
# eight rows a pass) or without VNNI (where k_few emulates vpdpbusd) from 16 rows at any width;
# with VNNI in 256 bits only from 32 rows of 1024 columns or more (bench/RESULTS.md, "K-quant
# prefill on packed panels", "Panels in zmm"; bench/quant_matvec.py --only panels).
GEMM_MIN = 16 if qgemm.WIDE or qgemm.DEEP else 32
GEMM_MIN_COLS = 0 if qgemm.WIDE or qgemm.DEEP else 1024


@register_jitable
def int_dot(kind):
    """Whether this kind's products can take int8 activations (qdot.py; kpanels.py)."""
    return kind == Q4_K or kind == Q5_K or kind == Q6_K or kind == Q4_KX8


@register_jitable
def gemm_size(rows, cols):
    """Whether a product of `rows` activation rows of `cols` values is large enough for the
    K-quants' GEMMs on packed panels (K_GEMM, P_GEMM)."""
    return rows >= GEMM_MIN and cols >= GEMM_MIN_COLS


@register_jitable
def kernel(kind, rows, cols, mode, legacy):
    """The kernel (L_ROWS .. F_DOT) that multiplies `rows` activation rows of `cols` values by
    a weight of `kind` (a WeightKind code), as the module docstring's table says: plain Python
    where Python calls it (a linear's path, 30 times a token), compiled into the jitted
    drivers."""
    if kind == F32 or kind == F16 or kind == BF16:
        return F_DOT
    if legacy and ldot.legacy(kind):
        return L_ROWS if rows <= LEGACY_FEW else L_GEMM
    panels = gemm_size(rows, cols)
    if kind == Q4_KX8:  # repacked only where int8 rows are taken: it always takes them
        return P_GEMM if panels else P_ROWS
    if mode > 0 and int_dot(kind):
        if rows == 1:
            return K_ROWS
        return K_GEMM if panels else K_FEW
    if rows == 1:
        return F_ROW
    return F_FEW if rows <= FEW_MAX else F_TILES


def kernel_name(kind: int, rows: int, cols: int, mode: int, legacy: bool) -> str:
    """`kernel`'s answer as a module and function name: "qdot.k_rows"."""
    return NAMES[kernel(kind, rows, cols, mode, legacy)]


def activation_mode(int8_activations: bool, w) -> int:
    """The backend's `mode` for products with w: 0 where it takes float32 activations (panels
    excepted: they were made for int8 rows and take them whatever is said later), else 2 for a
    weight whose inputs carry outliers (QuantTensor.outlier_inputs: one int8 row alone moved
    whole-model logits by ~5e-2 there), 1 otherwise."""
    if not int8_activations and not isinstance(w, PanelTensor):
        return 0
    return 2 if w.outlier_inputs else 1


def shared_launch(rows: int, kinds, legacy: bool) -> bool:
    """Whether weights that share their input (q/k/v, gate/up) can run as one launch over all
    their rows, each row range through its kernel (pool's linear_many): up to FEW_MAX rows, and
    none through lgemm's GEMM (L_GEMM), which quantizes and packs for the whole weight. (Decode
    asks this twice a layer: plain arithmetic, no table lookups.)"""
    return rows <= FEW_MAX and not (lgemm_rows(rows, legacy) and any(ldot.legacy(k) for k in kinds))


def shared_ways(kind: int, mode: int, legacy: bool, gemm: bool) -> tuple[int, int]:
    """The two kernels a weight of `kind` can take in a shared launch (shared_launch): the
    table's for one row and for more, among launches of `gemm_size` (`gemm`) or not, at any
    width. An entry compiled for these two alone leaves out the other kernels: a decode step's
    entry the GEMMs, and the float32 loops of a kind taking int8 rows."""
    if gemm:
        way = kernel(kind, GEMM_MIN, GEMM_MIN_COLS, mode, legacy)
        return way, way
    return kernel(kind, 1, 0, mode, legacy), kernel(kind, 2, 0, mode, legacy)


def lgemm_rows(rows: int, legacy: bool) -> bool:
    """Whether the legacy kinds' products of this many rows go through lgemm's GEMM (L_GEMM)."""
    return legacy and rows > LEGACY_FEW
