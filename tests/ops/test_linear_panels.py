"""Q4_K weights repacked into panels of eight rows (kpanels.py): the layout holds the file's bytes
(repacked and unpacked, every byte comes back; dequantised, the gguf package's values), and the
kernels that read it (p_rows: decode and a few rows; p_gemm: a prefill's many) agree with the
reference: within int8 rounding of the dequantised product, and within float32 rounding of
qdot's and qgemm's kernels on the same int8 rows (the integers summed are the same), on every
row range (a panel's edges, a short one, ranges that start or end inside a panel) and every
number of activation rows (passes of four, two and one; the GEMM's threshold). Through the
backends (linear_weight), a repacked weight gives what its original gives, alone, in a batch
and in a prefill, and a mapped original's pages are handed back.
"""

from __future__ import annotations

import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ops.helpers import NUMBA
from qblocks import assert_int8_close, kernel_call, random_blocks, width

from inferno.formats.quant import QuantTensor

RANGES = [(0, 1), (0, 2), (0, 7), (0, 8), (0, 9), (3, 66), (0, 63), (0, 64), (0, 65), (1, 512), (0, 511), (0, 512)]


def panels(rows, blocks, seed=0):
    from inferno.backends.numba import kpanels
    w = random_blocks("Q4_K", rows, width("Q4_K", blocks), seed=seed, readonly=True)
    return w, kpanels.repack(w)


@pytest.mark.parametrize("rows,blocks", [(8, 1), (16, 2), (64, 8), (24, 3)])
def test_repacked_rows_come_back_byte_for_byte(rows, blocks):
    from inferno.backends.numba import kpanels
    w, p = panels(rows, blocks, seed=rows + blocks)
    assert isinstance(p, kpanels.PanelTensor) and p.data.shape == w.data.shape and p.nbytes == w.nbytes
    assert not np.array_equal(p.data, w.data)  # really another layout
    assert np.array_equal(p.rows(0, rows).data, w.data)
    assert np.array_equal(p.rows(3, rows - 2).data, w.data[3:rows - 2])
    assert np.array_equal(p.dequantize(), w.dequantize())
    order = np.array([rows - 1, 0, 5])
    assert np.array_equal(p.take_rows(order).data, w.data[order])


def test_only_whole_panels_of_q4_k_repack():
    from inferno.backends.numba import kpanels
    assert kpanels.can_repack(random_blocks("Q4_K", 16, 256))
    assert not kpanels.can_repack(random_blocks("Q4_K", 12, 256))  # not whole panels
    assert not kpanels.can_repack(random_blocks("Q6_K", 16, 256))
    assert not kpanels.can_repack(kpanels.repack(random_blocks("Q4_K", 8, 256)))  # once


def reference_kernels(w, x, two):
    """qdot.k_few on the file's rows: the same integers, summed row by row."""
    from inferno.backends.numba import qdot
    xq = qdot.quantize(x, two)
    few = np.empty((x.shape[0], w.shape[0]), np.float32)
    kernel_call(qdot.k_few, qdot.Q4_K_BYTES, sliced=True)(w.data, xq, few, 0, w.shape[0])
    return xq, few


@pytest.mark.parametrize("r0,r1", RANGES)
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 9, 17, 33])
@pytest.mark.parametrize("two", [False, True])
def test_panel_kernels_on_every_row_range(r0, r1, batch, two):
    """p_rows on every batch, p_gemm from its least (qgemm.GEMM_ROWS_MIN)."""
    from inferno.backends.numba import kpanels, qgemm
    w, p = panels(512, 2, seed=batch)
    x = np.random.default_rng(batch).standard_normal((batch, w.shape[1]), dtype=np.float32)
    x[0, :256] = 0.0  # a zero unit: dx = 0
    xq, few = reference_kernels(w, x, two)
    scale = np.abs(x) @ np.abs(w.dequantize()).T
    for kernel in (kpanels.p_rows, kpanels.p_gemm)[:2 if batch >= qgemm.GEMM_ROWS_MIN else 1]:
        got = np.full((batch, 512), np.nan, np.float32)
        kernel_call(kernel, sliced=True)(p.data, xq, got, r0, r1)
        assert np.isnan(got[:, :r0]).all() and np.isnan(got[:, r1:]).all(), kernel  # only its rows
        assert (np.abs(got[:, r0:r1] - few[:, r0:r1]) <= 1e-6 * scale[:, r0:r1]).all(), kernel
    sub = QuantTensor("Q4_K", (r1 - r0, w.shape[1]), w.data[r0:r1])
    assert_int8_close(got[:, r0:r1], x, sub, two)


@pytest.mark.parametrize("blocks", [1, 3, 16])
@pytest.mark.parametrize("batch", [8, 9, 12, 13, 63, 64, 65])
def test_panel_gemm_on_one_super_block_and_many(blocks, batch):
    from inferno.backends.numba import kpanels
    w, p = panels(40, blocks, seed=blocks)
    x = np.random.default_rng(batch).standard_normal((batch, w.shape[1]), dtype=np.float32)
    for two in (False, True):
        xq, few = reference_kernels(w, x, two)
        got = np.empty_like(few)
        kernel_call(kpanels.p_gemm, sliced=True)(p.data, xq, got, 0, 40)
        assert_int8_close(got, x, w, two)
        assert (np.abs(got - few) <= 1e-6 * (np.abs(x) @ np.abs(w.dequantize()).T)).all()


@pytest.mark.backends(*NUMBA)
@pytest.mark.parametrize("outliers", [False, True])
def test_backends_repack_q4_k_linear_weights(backend, outliers, monkeypatch):
    """linear_weight repacks a Q4_K weight of whole panels where the backend takes int8
    activations; its products equal the original's, alone, in a few and in a prefill (a row's
    result does not depend on its batch), and through linear_many beside a weight that stays."""
    from inferno.backends.numba import kpanels
    monkeypatch.setattr(backend, "int8_activations", True)
    monkeypatch.setattr(backend, "q4k_panels", True)  # whatever this CPU's default (kpanels.pays_on)
    w = random_blocks("Q4_K", 72, 1024, seed=3, readonly=True)
    w.outlier_inputs = outliers
    kept, packed = backend.weight(w), backend.linear_weight(w)
    assert isinstance(packed, kpanels.PanelTensor) and packed.outlier_inputs == outliers
    x = np.random.default_rng(4).standard_normal((100, w.shape[1]), dtype=np.float32)
    alone = np.concatenate([backend.linear(x[b:b + 1], packed) for b in range(len(x))])
    scale = np.abs(x) @ np.abs(w.dequantize()).T
    for batch in (1, 2, 5, 16, 40, 100):
        got = backend.linear(x[:batch], packed)
        assert (np.abs(got - alone[:batch]) <= 1e-6 * scale[:batch]).all(), batch
        assert (np.abs(got - backend.linear(x[:batch], kept)) <= 1e-6 * scale[:batch]).all(), batch
    other = random_blocks("Q6_K", 24, 1024, seed=5, readonly=True)
    other.outlier_inputs = outliers  # linear_many takes x as its weights' most careful mode
    other = backend.linear_weight(other)
    for batch in (1, 3):
        a, b = backend.linear_many(x[:batch], [packed, other])
        assert (np.abs(a - alone[:batch]) <= 1e-6 * scale[:batch]).all()
        assert np.allclose(b, backend.linear(x[:batch], other), rtol=1e-5, atol=1e-5)


@pytest.mark.backends(*NUMBA)
def test_backends_keep_what_panels_cannot_hold(backend, monkeypatch):
    monkeypatch.setattr(backend, "int8_activations", True)
    monkeypatch.setattr(backend, "q4k_panels", True)
    odd = random_blocks("Q4_K", 12, 256, readonly=True)
    assert type(backend.linear_weight(odd)) is QuantTensor
    monkeypatch.setattr(backend, "q4k_panels", False)  # a CPU where they do not pay
    assert type(backend.linear_weight(random_blocks("Q4_K", 16, 256, readonly=True))) is QuantTensor
    monkeypatch.setattr(backend, "q4k_panels", True)
    monkeypatch.setattr(backend, "int8_activations", False)  # float32 activations: the file's rows
    assert type(backend.linear_weight(random_blocks("Q4_K", 16, 256, readonly=True))) is QuantTensor


def test_panels_by_default_where_measured_to_pay():
    from inferno.backends.numba import kpanels
    assert kpanels.pays_on("znver4")
    assert not kpanels.pays_on("znver5")  # decode from DRAM 0.85x there
    assert not kpanels.pays_on("haswell") and not kpanels.pays_on("sapphirerapids")  # not measured


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_a_one_core_backend_repacks_on_its_own_thread():
    """simd repacks without Numba's thread team (which would start threads at every load, and
    makes a process that later forks and repacks abort under OpenMP); pool on its own threads.
    In a fresh process: nothing else has started the team there."""
    script = (
        "import os, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from qblocks import random_blocks\n"
        "from inferno.backends.numba import kpanels\n"
        "from inferno.backends.numba.simd import SimdBackend\n"
        "ops = SimdBackend(int8_activations=True)\n"
        "ops.q4k_panels = True\n"
        "w = random_blocks('Q4_K', 64, 1024, readonly=True)\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "p = ops.linear_weight(w)\n"
        "assert isinstance(p, kpanels.PanelTensor)\n"
        "print(before, len(os.listdir('/proc/self/task')))\n")
    run = subprocess.run([sys.executable, "-c", script, str(Path(__file__).parents[1])],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    before, after = map(int, run.stdout.split()[-2:])
    assert after == before


@pytest.mark.backends(*NUMBA)
def test_panels_handed_to_weight_stay_panels(backend, monkeypatch):
    from inferno.backends.numba import kpanels
    monkeypatch.setattr(backend, "int8_activations", True)
    monkeypatch.setattr(backend, "q4k_panels", True)
    p = backend.linear_weight(random_blocks("Q4_K", 16, 256, readonly=True))
    again = kpanels.PanelTensor(p.qtype, p.shape, p.data.copy(), p.outlier_inputs)  # writeable
    kept = backend.weight(again)
    assert isinstance(kept, kpanels.PanelTensor) and not kept.data.flags.writeable


def test_release_hands_back_a_mapped_tensors_pages_and_nothing_else(tmp_path):
    """After release, the mapped bytes read the same (the file's pages come back on the next
    read); an array of the heap is left as it is."""
    from inferno.backends.numba import kpanels
    data = np.random.default_rng(0).integers(0, 256, 5 * mmap.PAGESIZE, dtype=np.uint8)
    path = tmp_path / "w.bin"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(buf, np.uint8, count=3 * mmap.PAGESIZE + 100, offset=700).reshape(-1, 4)
    assert view.sum() > 0
    kpanels.release(view)
    assert np.array_equal(view.reshape(-1), data[700:700 + view.size])
    heap = data.copy()
    kpanels.release(heap)
    assert np.array_equal(heap, data)
