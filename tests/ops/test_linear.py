"""linear: x [rows, in] @ w.T for a weight w [out, in], float32 or quantized.

Float weights: against the float64 product at rows on both sides of the 64-row tile edge (1 is
decode's matvec), 150 outputs (not a multiple of the matvec's 4), and an lm_head-sized matvec
(4099 x 576) big enough for the pool to split into uneven parts.

Quantized weights, every GGML type (random blocks, qblocks.py, whose docstring gives the bounds):
rows of one block and of many, row counts that are not a multiple of the kernels' two rows per
pass; 1 (decode), 2..16 (a few) and 17 (prefill) activation rows; float32 activations within
float32 rounding of the dequantised product, int8 activations (simd and pool's K-quants) and
int16 ones (their legacy kinds, where int16_legacy says so) within what rounding them may cost. torch dequantises the weight once, in weight(), and runs a
float32 matmul: within float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import NUMBA, assert_close, call, f32, host, rand
from qblocks import (assert_int8_close, assert_int16_close, assert_matches, assert_rounding_close, float_case,
                     kernel_call, magnitudes, random_blocks, width)

from inferno.formats.quant import QTYPES

SEQS = [1, 17, 63, 64, 65, 100, 200]


def linear(backend, x, w):
    return host(backend, backend.linear(backend.from_numpy(x), backend.weight(w)))


# -- float32 weights ------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", SEQS)
def test_linear(backend, rows):
    x, w = rand(rows, 96, seed=rows), rand(150, 96, seed=1)  # 150 outputs: not a multiple of 4
    assert_close(linear(backend, x, w), f32(x.astype(np.float64) @ w.T))


def test_linear_lm_head_shape(backend):
    """A matvec big enough for the pool to split (and rows not a multiple of the split)."""
    x, w = rand(1, 576, seed=3), rand(4099, 576, seed=4)
    assert_close(linear(backend, x, w), f32(x.astype(np.float64) @ w.T))


# -- quantized weights ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(QTYPES))
@pytest.mark.parametrize("rows,blocks", [(1, 1), (2, 3), (7, 2), (33, 5)])
@pytest.mark.parametrize("batch", [1, 2, 3, 7, 16, 17])
def test_linear_matches_dequantised_matmul(backend, name, rows, blocks, batch):
    w = random_blocks(name, rows, width(name, blocks), seed=rows * 31 + blocks, readonly=True)
    x = np.random.default_rng(batch).standard_normal((batch, w.shape[1]), dtype=np.float32)
    assert_matches(backend, linear(backend, x, w), x, w)


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("rows,blocks", [(1, 1), (7, 2), (33, 5)])
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 7])
def test_decode_with_and_without_int8_activations(backend, name, mode, rows, blocks, batch, monkeypatch):
    """The decode and few-row kernels of the K-quants: float32 activations (exact), one int8
    row and two, for one activation row and for a few (every pass of four, two and one; where
    x86 has no AVX2 they compile to plain LLVM vector arithmetic: correct, if slow).
    Activations of every scale, a zero run and a lone spike."""
    monkeypatch.setattr(backend, "int8_activations", mode > 0)
    w = random_blocks(name, rows, width(name, blocks), seed=rows + blocks, readonly=True)
    w.outlier_inputs = mode == 2  # a remainder row too
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((batch, w.shape[1]), dtype=np.float32)
    x *= rng.choice([1e-6, 1.0, 1e4], (batch, w.shape[1] // 256)).repeat(256, axis=1).astype(np.float32)
    x[0, :256] = 0.0  # dx = 0: every qx 0
    if blocks > 1:
        x[-1, 300] = 1e3  # one value sets the scale of its 256
    got = backend.linear(x, backend.weight(w))
    if mode:
        assert_int8_close(got, x, w, mode == 2)
    else:
        assert_rounding_close(got, x, w)


LEGACY = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("name", LEGACY)
@pytest.mark.parametrize("int16", [False, True])
@pytest.mark.parametrize("rows,blocks", [(1, 1), (7, 2), (33, 9)])
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 7, 17])
def test_legacy_kinds_with_and_without_int16_activations(backend, name, int16, rows, blocks, batch, monkeypatch):
    """The legacy kinds' kernels with float32 activations (exact) and, whatever the machine would
    choose, int16 ones (ldot.py: a few rows through l_rows, more through lgemm's GEMM, in
    integers): activations of every scale, a zero block and a lone spike."""
    monkeypatch.setattr(backend, "int8_activations", int16)
    monkeypatch.setattr(backend, "int16_legacy", int16)
    w = random_blocks(name, rows, width(name, blocks), seed=rows + blocks, readonly=True)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((batch, w.shape[1]), dtype=np.float32)
    x *= rng.choice([1e-6, 1.0, 1e4], (batch, w.shape[1] // 32)).repeat(32, axis=1).astype(np.float32)
    x[0, :32] = 0.0  # dx = 0: every qx 0
    x[-1, w.shape[1] // 2] = 1e5  # one value sets the scale of its block
    got = backend.linear(x, backend.weight(w))
    if int16:
        assert_int16_close(got, x, w)
    else:
        assert_rounding_close(got, x, w)


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("int16", [False, True])
@pytest.mark.parametrize("batch", [1, 3, 20, 512])
def test_mxfp4_with_and_without_int16_activations(backend, int16, batch, monkeypatch):
    """MXFP4 (gpt-oss's experts), a legacy kind: decode, a few rows and a prefill, through the
    float32 kernels (matvec_rows, few_rows, dequantised tiles) or in int16 (l_rows, lgemm's
    GEMM), with scales from 2^-88 to 2^32 (qblocks.py), a zero block and a lone spike."""
    monkeypatch.setattr(backend, "int8_activations", int16)
    monkeypatch.setattr(backend, "int16_legacy", int16)
    w = random_blocks("MXFP4", 37, 32 * 9, seed=batch, readonly=True)
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, w.shape[1]), dtype=np.float32)
    x[0, :32] = 0.0  # dx = 0: every qx 0
    x[-1, w.shape[1] // 2] = 1e5
    got = backend.linear(x, backend.weight(w))
    if int16:
        assert_int16_close(got, x, w)
    else:
        assert_rounding_close(got, x, w)


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("name,outliers", [("Q4_K", False), ("Q4_K", True), ("Q5_K", False), ("Q5_K", True),
                                           ("Q6_K", False), ("Q6_K", True)] + [(k, False) for k in LEGACY + ["MXFP4"]])
def test_int8_rows_do_not_depend_on_their_batch(backend, name, outliers, monkeypatch):
    """With int8 activations (the K-quants) or int16 (the legacy kinds) a row's product is the
    same alone (decode), among a few (a batched step) and among many (a prefill), up to float32
    rounding (the legacy kinds: bit for bit, tests/test_invariance.py): every row is quantized on
    its own and multiplied the same way, so a sequence's logits do not depend on how its tokens
    were grouped into steps."""
    monkeypatch.setattr(backend, "int8_activations", True)
    monkeypatch.setattr(backend, "int16_legacy", True)
    w = random_blocks(name, 37, width(name, 4 if name.endswith("_K") else 32), seed=2, readonly=True)  # 1024: wide enough for the panels
    w.outlier_inputs = outliers
    kept = backend.weight(w)
    x = np.random.default_rng(5).standard_normal((100, w.shape[1]), dtype=np.float32)
    alone = np.concatenate([backend.linear(x[b:b + 1], kept) for b in range(len(x))])
    scale = np.abs(x) @ magnitudes(w).T
    for batch in (2, 5, 16, 40, 100):  # 100: quantized on every thread (PAR_ACTIVATIONS)
        got = backend.linear(x[:batch], kept)
        assert (np.abs(got - alone[:batch]) <= 1e-6 * scale[:batch]).all(), batch


@pytest.mark.backends("simd")
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("outliers", [False, True])
@pytest.mark.parametrize("batch", [8, 9, 12, 13, 63, 64, 65, 511])
@pytest.mark.parametrize("rows,blocks", [(1, 1), (9, 1), (16, 2), (33, 7)])
def test_int8_gemm_on_panels(backend, name, outliers, batch, rows, blocks):
    """qgemm.k_gemm, called directly on row counts from its least (tile edges: passes of eight
    where the machine has 32 vector registers, else four, and two with remainder rows; a tail
    taken by a pass over some rows again; panels of sixteen weight rows with a short last one),
    one super-block
    and many: within int8 rounding of the dequantised product, and within float32 rounding of
    qdot's kernels on the same int8 rows (the integers summed are the same)."""
    from inferno.backends.numba import qdot, qgemm
    w = random_blocks(name, rows, width(name, blocks), seed=rows * 7 + blocks, readonly=True)
    x = np.random.default_rng(batch).standard_normal((batch, w.shape[1]), dtype=np.float32)
    x[0, :256] = 0.0  # a zero unit: dx = 0
    xq = qdot.quantize(x, outliers)
    ub = {"Q4_K": qdot.Q4_K_BYTES, "Q5_K": qdot.Q5_K_BYTES, "Q6_K": qdot.Q6_K_BYTES}[name]
    got = np.full((batch, rows), np.nan, np.float32)
    kernel_call(qgemm.k_gemm, ub, sliced=True)(w.data, xq, got, 0, rows)
    assert_int8_close(got, x, w, outliers)
    few = np.empty_like(got)
    kernel_call(qdot.k_few, ub, sliced=True)(w.data, xq, few, 0, rows)
    scale = np.abs(x) @ np.abs(w.dequantize()).T
    assert (np.abs(got - few) <= 1e-6 * scale).all()


@pytest.mark.backends("simd")
@pytest.mark.parametrize("name", LEGACY)
@pytest.mark.parametrize("batch", [1, 2, 7, 8, 9, 63, 64, 65, 511])
@pytest.mark.parametrize("rows,blocks", [(1, 1), (9, 1), (16, 2), (24, 2), (29, 3), (33, 7), (49, 3), (64, 1)])
def test_int16_gemm_on_panels(backend, name, batch, rows, blocks):
    """lgemm.l_gemm, called directly (whether or not this machine's backends choose it) on every
    row count (passes of four, two and one activation rows; passes of 32 weight rows, two
    panels of sixteen, with short and empty last panels), one block and many: within int16
    rounding of the dequantised product, and equal bit for bit to ldot.l_rows on the same int16
    rows, one at a time and all at once (the same sums in the same order: batch invariance)."""
    from inferno.backends.numba import ldot, lgemm
    from inferno.backends.numba.codes import WeightKind
    kind = int(WeightKind[name])
    w = random_blocks(name, rows, 32 * blocks, seed=rows * 7 + blocks, readonly=True)
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, w.shape[1]), dtype=np.float32)
    x *= rng.choice([1e-6, 1.0, 1e4], (batch, blocks)).repeat(32, axis=1).astype(np.float32)
    x[0, :32] = 0.0  # a zero block: dx = 0
    x16, dx, xs = ldot.quantized(x)
    got = np.full((batch, rows), np.nan, np.float32)
    kernel_call(lgemm.l_gemm, kind)(w.data, (x16, dx, xs), got, 0, rows)
    assert_int16_close(got, x, w)
    alone = np.empty_like(got)
    l_rows = kernel_call(ldot.l_rows, kind)
    for b in range(batch):  # one row at a time: the same sums in the same order, bit for bit
        l_rows(w.data, (x16[b:b + 1], dx[b:b + 1], xs[b:b + 1]), alone[b:b + 1], 0, rows)
    np.testing.assert_array_equal(got, alone)
    few = np.empty_like(got)
    l_rows(w.data, (x16, dx, xs), few, 0, rows)  # every row at once, as a batched step
    np.testing.assert_array_equal(few, alone)


# Haswell's features: AVX2 and FMA, no AVX-512, no VNNI (some of this project's machines).
AVX2_ONLY = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,"
             "+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave")
# Skylake-X's: AVX-512 (32 registers, 512-bit vpmaddubsw) without VNNI.
AVX512_NO_VNNI = AVX2_ONLY + ",+avx512f,+avx512bw,+avx512cd,+avx512dq,+avx512vl"


def _no_vnni_targets():
    """Haswell everywhere; Skylake-X only where this host can run its code (AVX-512 BW)."""
    from numba.core.codegen import get_host_cpu_features
    targets = [("haswell", AVX2_ONLY)]
    if "+avx512bw" in get_host_cpu_features().split(","):
        targets.append(("skylake-avx512", AVX512_NO_VNNI))
    return targets


NO_VNNI = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
from qblocks import float_case, kernel_call, random_blocks
from inferno.backends.numba import ilanes, qdot, qgemm
assert ilanes.fast_int_dot() and not ilanes._vnni() and qgemm.WIDE
assert qgemm.DEEP == ("+avx512f" in {features!r})
for name, ub in (("Q4_K", qdot.Q4_K_BYTES), ("Q5_K", qdot.Q5_K_BYTES), ("Q6_K", qdot.Q6_K_BYTES)):
    for two in (False, True):
        w = random_blocks(name, 19, 512, seed=1)
        x = np.random.default_rng(2).standard_normal((9, 512), dtype=np.float32)
        got = np.empty((9, 19), np.float32)
        kernel_call(qgemm.k_gemm, ub, sliced=True)(w.data, qdot.quantize(x, two), got, 0, 19)
        np.save({out!r} + f"/{{name}}-{{two}}.npy", got)
from inferno.backends.numba import kpanels
p = kpanels.repack(random_blocks("Q4_K", 24, 512, seed=1))
for two in (False, True):
    for kernel in (kpanels.p_rows, kpanels.p_gemm):
        x = np.random.default_rng(2).standard_normal((9, 512), dtype=np.float32)
        got = np.empty((9, 24), np.float32)
        kernel_call(kernel, sliced=True)(p.data, qdot.quantize(x, two), got, 0, 24)
        np.save({out!r} + f"/panels-{{kernel.__name__}}-{{two}}.npy", got)
from inferno.backends.numba import ldot, lgemm
from inferno.backends.numba.codes import WeightKind
assert not lgemm.FAST
for name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
    w = random_blocks(name, 29, 96, seed=3)
    x = np.random.default_rng(4).standard_normal((7, 96), dtype=np.float32)
    got = np.empty((7, 29), np.float32)
    kernel_call(lgemm.l_gemm, int(WeightKind[name]))(w.data, ldot.quantized(x), got, 0, 29)
    np.save({out!r} + f"/{{name}}.npy", got)
from inferno.backends.numba import lpanels
for name in ("Q4_0", "Q4_1", "MXFP4"):
    p = lpanels.repack(random_blocks(name, 32, 96, seed=3))
    x = np.random.default_rng(4).standard_normal((7, 96), dtype=np.float32)
    for kernel, b in ((lgemm.l_gemm, 7), (ldot.l_rows, 1), (ldot.l_rows, 5)):
        got = np.empty((b, 32), np.float32)
        kernel_call(kernel, int(WeightKind[name + "X16"]))(p.data, ldot.quantized(x[:b]), got, 0, 32)
        np.save({out!r} + f"/{{name}}X16-{{kernel.__name__}}-{{b}}.npy", got)
from inferno.backends.numba import fdot
assert fdot.BLOCK == (4 if "+avx512f" in {features!r} else 2)
for name in ("F32", "F16", "BF16"):
    w, x = float_case(name)
    got = np.empty((11, 37), np.float32)
    call = kernel_call(fdot.f_rows, int(WeightKind[name]), sliced=True)
    call(w, (x,), got, 0, 37)
    for b in range(11):  # one order on this CPU too: a row alone is the row in a block
        alone = np.empty((1, 37), np.float32)
        call(w, (x[b:b + 1],), alone, 0, 37)
        assert (alone[0] == got[b]).all(), (name, b)
    np.save({out!r} + f"/{{name}}.npy", got)
"""


_BUILDS: dict[str, tuple] = {}  # cpu -> (process, its folder), started by start_early
WAITS_FOR_EARLY = ("test_int8_gemm_without_vnni",)  # (tests/conftest.py runs it last)


def start_early(items, config) -> None:
    """The builds for other CPUs that the selected test_int8_gemm_without_vnni items will
    check, started as the session starts (tests/conftest.py), each in a process of its own at
    a lower priority: they compile for a minute or two, on the core the suite's own compiles,
    which run on one, leave idle, and the test then only reads their answers."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    wanted = {item.callspec.params["cpu"] for item in items if item.originalname == "test_int8_gemm_without_vnni"}
    for cpu, features in _no_vnni_targets():
        if cpu in wanted and cpu not in _BUILDS:
            out = config._tmp_path_factory.mktemp(f"no-vnni-{cpu}")
            env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES=features)
            script = NO_VNNI.format(tests=str(Path(__file__).parents[1]), out=str(out), features=features)
            with open(out / "stderr", "w") as err:  # (a file: a pipe nobody reads yet could fill)
                _BUILDS[cpu] = (subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                                                 stderr=err, preexec_fn=lambda: os.nice(10)), out)
            config.add_cleanup(_BUILDS[cpu][0].kill)  # (a run stopped before the test)


@pytest.mark.backends("simd")
@pytest.mark.parametrize("cpu,features", _no_vnni_targets(), ids=lambda v: v if "," not in v else "")
def test_int8_gemm_without_vnni(backend, cpu, features, request):
    """Compiled for a machine without VNNI (Numba told so, in a fresh process: qgemm.WIDE,
    int16 sums of vpmaddubsw's pairs; lgemm's vpdpwssd as vpmaddwd and an add), the kernels give
    the same answers as this process's build (vpdpbusd and vpdpwssd where the host has VNNI):
    the same integer sums, within float32 rounding. Haswell's AVX2 (ilanes' 512-bit vectors as
    two ymm halves, qgemm's passes of four rows) and, where the host can run it, Skylake-X's
    AVX-512 without VNNI (512-bit vpmaddubsw, passes of eight rows: qgemm.DEEP). Float weights
    (fdot.py: two activation rows a pass without AVX-512) give the same bits on every CPU."""
    from inferno.backends.numba import qdot, qgemm
    start_early([request.node], request.config)  # (started already, unless run on its own)
    build, tmp_path = _BUILDS[cpu]
    assert build.wait(timeout=600) == 0, (tmp_path / "stderr").read_text()[-3000:]
    for name in ("Q4_K", "Q5_K", "Q6_K"):
        for two in (False, True):
            w = random_blocks(name, 19, 512, seed=1)
            x = np.random.default_rng(2).standard_normal((9, 512), dtype=np.float32)
            wide = np.load(tmp_path / f"{name}-{two}.npy")
            assert_int8_close(wide, x, w, two)
            here = np.empty_like(wide)
            ub = {"Q4_K": qdot.Q4_K_BYTES, "Q5_K": qdot.Q5_K_BYTES, "Q6_K": qdot.Q6_K_BYTES}[name]
            kernel_call(qgemm.k_gemm, ub, sliced=True)(w.data, qdot.quantize(x, two), here, 0, 19)
            assert (np.abs(wide - here) <= 1e-6 * (np.abs(x) @ np.abs(w.dequantize()).T)).all()
    from inferno.backends.numba import kpanels
    w = random_blocks("Q4_K", 24, 512, seed=1)
    p = kpanels.repack(w)
    x = np.random.default_rng(2).standard_normal((9, 512), dtype=np.float32)
    for two in (False, True):  # kpanels' dpbusd as vpmaddubsw, vpmaddwd and an add
        for kernel in (kpanels.p_rows, kpanels.p_gemm):
            wide = np.load(tmp_path / f"panels-{kernel.__name__}-{two}.npy")
            assert_int8_close(wide, x, w, two)
            here = np.empty_like(wide)
            kernel_call(kernel, sliced=True)(p.data, qdot.quantize(x, two), here, 0, 24)
            assert (np.abs(wide - here) <= 1e-6 * (np.abs(x) @ np.abs(w.dequantize()).T)).all()
    from inferno.backends.numba import ldot, lgemm
    from inferno.backends.numba.codes import WeightKind
    for name in LEGACY:  # lgemm's dpwssd as vpmaddwd + vpaddd: the same integers
        w = random_blocks(name, 29, 96, seed=3)
        x = np.random.default_rng(4).standard_normal((7, 96), dtype=np.float32)
        wide = np.load(tmp_path / f"{name}.npy")
        assert_int16_close(wide, x, w)
        here = np.empty_like(wide)
        kernel_call(lgemm.l_gemm, int(WeightKind[name]))(w.data, ldot.quantized(x), here, 0, 29)
        assert (np.abs(wide - here) <= 1e-6 * (np.abs(x) @ magnitudes(w).T)).all()
    for name in ("Q4_0", "Q4_1", "MXFP4"):  # in panels (MXFP4's lookups in two 256-bit halves on
        w = random_blocks(name, 32, 96, seed=3)  # Haswell, one zmm on Skylake-X): the file's rows' bits
        x = np.random.default_rng(4).standard_normal((7, 96), dtype=np.float32)
        for kernel, b in ((lgemm.l_gemm, 7), (ldot.l_rows, 1), (ldot.l_rows, 5)):
            here = np.empty((b, 32), np.float32)
            kernel_call(kernel, int(WeightKind[name]))(w.data, ldot.quantized(x[:b]), here, 0, 32)
            np.testing.assert_array_equal(np.load(tmp_path / f"{name}X16-{kernel.__name__}-{b}.npy"), here,
                                          err_msg=f"{cpu}: {name}X16, {kernel.__name__}, {b} rows")
    from inferno.backends.numba import fdot
    for name in ("F32", "F16", "BF16"):  # one order of arithmetic on every CPU: the same bits
        w, x = float_case(name)
        here = np.empty((11, 37), np.float32)
        kernel_call(fdot.f_rows, int(WeightKind[name]), sliced=True)(w, (x,), here, 0, 37)
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}.npy"), here, err_msg=f"{cpu}: {name}")


@pytest.mark.backends("simd")
def test_int16_gemm_writes_only_its_rows(backend):
    """lgemm.l_gemm on a row range that starts and ends inside its passes of 32 rows: the
    rows outside it are left alone."""
    from inferno.backends.numba import ldot, lgemm
    from inferno.backends.numba.codes import WeightKind
    w = random_blocks("Q5_0", 60, 64, seed=3, readonly=True)
    x = np.random.default_rng(1).standard_normal((9, 64), dtype=np.float32)
    got = np.full((9, 60), np.nan, np.float32)
    kernel_call(lgemm.l_gemm, int(WeightKind.Q5_0))(w.data, ldot.quantized(x), got, 5, 45)
    assert np.isnan(got[:, :5]).all() and np.isnan(got[:, 45:]).all()
    assert_int16_close(got[:, 5:45], x, w.take_rows(np.arange(5, 45)))


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "MXFP4"])
def test_legacy_panels_are_the_files_rows(backend, name):
    """Q4_0, Q4_1 and MXFP4 stored as panels of sixteen rows (lpanels.py) unpack to the file's
    bytes, and multiply to the file's rows' bits: one row and a few (lpanels.m_rows), a prefill
    (lgemm's GEMM, which unpacks them), a weight of an odd number of panels (a pass's second
    panel empty), and row ranges that cut panels (the rows outside them left alone)."""
    from inferno.backends.numba import ldot, lpanels
    from inferno.backends.numba.codes import WeightKind
    if not backend._legacy:
        pytest.skip("this CPU takes the legacy kinds' activations in float32")
    for rows, cols in ((48, 64), (96, 2880)):
        w = random_blocks(name, rows, cols, seed=rows, readonly=True)
        p = lpanels.repack(w)
        assert WeightKind.of(p) is WeightKind[name + "X16"] and p.data.shape == w.data.shape
        np.testing.assert_array_equal(p.rows(0, rows).data, w.data)
        np.testing.assert_array_equal(p.rows(5, 37).data, w.data[5:37])
        np.testing.assert_array_equal(p.dequantize(3, 20), w.dequantize(3, 20))
        rng = np.random.default_rng(rows)
        for b in (1, 2, 3, 8, 9, 17, 40):
            x = rng.standard_normal((b, cols), dtype=np.float32)
            np.testing.assert_array_equal(backend.linear(x, p), backend.linear(x, w), err_msg=f"{b} rows")
        for b in (1, 5):
            x = rng.standard_normal((b, cols), dtype=np.float32)
            want = np.empty((b, rows), np.float32)
            kernel_call(ldot.l_rows, int(WeightKind[name]))(w.data, ldot.quantized(x), want, 0, rows)
            for r0, r1 in ((3, 29), (16, 32), (17, 18), (0, rows)):
                got = np.full((b, rows), np.nan, np.float32)
                kernel_call(ldot.l_rows, int(WeightKind[name + "X16"]))(p.data, ldot.quantized(x), got, r0, r1)
                assert np.isnan(got[:, :r0]).all() and np.isnan(got[:, r1:]).all()
                np.testing.assert_array_equal(got[:, r0:r1], want[:, r0:r1], err_msg=f"{b} rows, {r0}..{r1}")


@pytest.mark.backends("simd")
def test_legacy_panels_only_where_they_fit(backend):
    """A Q4_0, Q4_1 or MXFP4 linear weight is repacked where its rows are whole panels, a stack of
    experts where each expert's rows are; anything else (another kind, rows not a multiple of
    sixteen, an embedding's table) stays as the file's rows."""
    from inferno.backends.numba import lpanels
    assert lpanels.can_repack(random_blocks("MXFP4", 64, 64), 4)
    assert not lpanels.can_repack(random_blocks("MXFP4", 64, 64), 8)  # 8 rows an expert
    assert not lpanels.can_repack(random_blocks("MXFP4", 40, 64))
    assert lpanels.can_repack(random_blocks("Q4_0", 64, 64)) and lpanels.can_repack(random_blocks("Q4_1", 64, 64))
    assert not lpanels.can_repack(random_blocks("Q8_0", 64, 64))
    assert not lpanels.can_repack(lpanels.repack(random_blocks("MXFP4", 64, 64)))
    if backend._legacy and backend.legacy_panels:
        assert type(backend.experts_weight(random_blocks("MXFP4", 64, 64), 4)) is lpanels.LegacyPanels
        assert type(backend.linear_weight(random_blocks("Q4_1", 64, 64))) is lpanels.LegacyPanels
    assert type(backend.experts_weight(random_blocks("MXFP4", 64, 64), 8)) is not lpanels.LegacyPanels
    assert type(backend.linear_weight(random_blocks("Q4_0", 40, 64))) is not lpanels.LegacyPanels
    assert type(backend.weight(random_blocks("MXFP4", 64, 64))) is not lpanels.LegacyPanels


@pytest.mark.backends("simd")
@pytest.mark.parametrize("outliers", [False, True])
def test_int8_gemm_refuses_fewer_rows_than_a_pass(backend, outliers):
    """Its passes would read past the activations: fewer rows are qdot.k_few's (the table never
    sends them: dispatch.GEMM_MIN)."""
    from inferno.backends.numba import kpanels, qdot, qgemm
    w = random_blocks("Q4_K", 16, 256, seed=3, readonly=True)
    x = np.random.default_rng(1).standard_normal((qgemm.GEMM_ROWS_MIN - 1, 256), dtype=np.float32)
    got = np.zeros((x.shape[0], 16), np.float32)
    with pytest.raises(ValueError, match="GEMM_ROWS_MIN"):
        kernel_call(qgemm.k_gemm, qdot.Q4_K_BYTES, sliced=True)(w.data, qdot.quantize(x, outliers), got, 0, 16)
    with pytest.raises(ValueError, match="GEMM_ROWS_MIN"):
        kernel_call(kpanels.p_gemm, sliced=True)(kpanels.repack(w).data, qdot.quantize(x, outliers), got, 0, 16)


@pytest.mark.backends("simd")
def test_int8_gemm_writes_only_its_rows(backend):
    """A row range that starts and ends inside panels (the pool splits rows by sixteens, but a
    caller may pass any range): the rows outside it are left alone."""
    from inferno.backends.numba import qdot, qgemm
    w = random_blocks("Q4_K", 40, 512, seed=3, readonly=True)
    x = np.random.default_rng(1).standard_normal((9, 512), dtype=np.float32)
    xq = qdot.quantize(x, False)
    got = np.full((9, 40), np.nan, np.float32)
    kernel_call(qgemm.k_gemm, qdot.Q4_K_BYTES, sliced=True)(w.data, xq, got, 5, 27)
    assert np.isnan(got[:, :5]).all() and np.isnan(got[:, 27:]).all()
    assert_int8_close(got[:, 5:27], x, w.take_rows(np.arange(5, 27)), False)


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("name", list(QTYPES))
@pytest.mark.parametrize("int8,outliers", [(False, False), (True, False), (True, True)])
def test_prefill_tiles_and_partial_tiles(backend, name, int8, outliers, monkeypatch):
    """Many activation rows: dequantised tiles into sgemm, with a last tile that is short; or,
    for the K-quants with int8 activations, their integer kernels, with the
    remainder row for a weight whose inputs carry outliers."""
    from inferno.backends.numba import pool, simd
    monkeypatch.setattr(backend, "int8_activations", int8)
    monkeypatch.setattr(simd, "prefill_tile", lambda cols: 16)
    monkeypatch.setattr(pool, "prefill_tile", lambda cols: 16)
    w = random_blocks(name, 41, width(name, 2), seed=5)
    w.outlier_inputs = outliers
    x = np.random.default_rng(0).standard_normal((40, w.shape[1]), dtype=np.float32)
    assert_matches(backend, backend.linear(x, backend.weight(w)), x, w)


@pytest.mark.backends(*NUMBA)
def test_linear_rejects_a_mismatched_width(backend):
    """The kernels read without bounds checks, so the width is checked before any launch."""
    w = backend.weight(random_blocks("Q4_0", 4, 64))
    with pytest.raises(ValueError, match="32 columns, the weight 64"):
        backend.linear(np.ones((1, 32), dtype=np.float32), w)


@pytest.mark.backends("cpu")
def test_reference_linear_tiles_bound_memory(backend, monkeypatch):
    """The reference dequantises a few rows at a time and still gets every row."""
    from inferno.backends import base
    monkeypatch.setattr(base, "QUANT_TILE", 3 * 64)  # three rows of 64 per tile
    w = random_blocks("Q5_1", 10, 64, seed=4)
    x = np.random.default_rng(0).standard_normal((2, 64), dtype=np.float32)
    assert_rounding_close(call(backend, "linear", x, w), x, w)


# -- the weight streams' prefetch ---------------------------------------------------------------
@pytest.mark.parametrize("cpu, locality", [("znver4", 3), ("znver1", 3), ("znver5", 3), ("sapphirerapids", 2),
                                           ("skylake-avx512", 2), ("generic", 2), ("neoverse-v2", 2)])
def test_prefetch_locality_by_vendor(cpu, locality):
    """Into L1 on AMD's cores, L2 elsewhere (lanes.prefetch_locality says why)."""
    from inferno.backends.numba import lanes
    assert lanes.prefetch_locality(cpu) == locality


def test_prefetch_reaches_the_code_with_the_targets_locality():
    import numba as nb

    from inferno.backends.numba import lanes

    @nb.njit
    def touch(f):
        lanes.prefetch(f, 64)
        return f[0]

    f = np.arange(256, dtype=np.uint8)
    assert touch(f) == 0
    calls = [ln for ir in touch.inspect_llvm().values() for ln in ir.splitlines()
             if "call void @llvm.prefetch" in ln]
    assert calls and all(ln.endswith(f"i32 0, i32 {lanes.PREFETCH_LOCALITY}, i32 1)") for ln in calls)
