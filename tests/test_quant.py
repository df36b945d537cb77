"""Quantized weights: every kernel of every type pinned to the reference, the gguf package's
dequantisation followed by a float32 matmul (QuantTensor.dequantize, the cpu backend).

Weights are random blocks built byte by byte (qblocks.py): zero and extreme float16 scales,
negative mins, every nibble and sign; rows of one block and of many; row counts that are not a
multiple of the kernels' two rows per pass; 1 (decode), 2..16 (a few) and more (prefill)
activation rows. With float32 activations the kernels agree with the reference within float32
rounding: the error of each output, relative to sum(|w| |x|) over its row, stays under
1e-7 x sqrt(cols) (float32's unit roundoff is 6e-8; summation order differs, as in BLAS).
Dequantised weights (embedding, prefill tiles) are equal to the reference bit for bit.

Products of Q4_K and Q6_K weights with one or a few activation rows may take int8 activations
(qdot.py; the backends' int8_activations): per row ggml's Q8_K, scale dx per 256 values (a
row's last unit may be shorter), plus for weights whose inputs carry outliers (outlier_inputs:
o_proj, down_proj) a second int8 row for its remainder, scale dr. Such a product is pinned
twice: to the reference run on the dequantised activations, within float32 rounding as above;
and to the reference on the float32 activations within what rounding them may cost, sum over
the row of |w_i| d_i / 2 (each activation moves by at most half a step of its unit's last
scale d).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize
from qblocks import random_blocks

from inferno.backends.numba import qdot
from inferno.backends.numba import qkernels as Q
from inferno.backends.numba.codes import WeightKind
from inferno.backends.cpu import CpuBackend
from inferno.backends.numba.pool import PoolBackend
from inferno.backends.numba.qkernels import quantize
from inferno.formats.quant import QTYPES, QuantTensor
from inferno.errors import InfernoError
from inferno.backends.numba.simd import SimdBackend

TYPES = list(QTYPES)
REF = CpuBackend()


def width(name: str, blocks: int) -> int:
    return blocks * max(QTYPES[name].block, 32)


@pytest.fixture(scope="module", params=["simd", "pool-eager", "pool-1"])
def ops(request):
    """simd; the pool with its size thresholds at zero (every op a parallel launch on 2
    threads, as small shapes would otherwise run serially); the pool on one thread."""
    if request.param == "simd":
        backend = SimdBackend()
    else:
        backend = PoolBackend(threads=2 if request.param == "pool-eager" else 1)
        backend.parallel_min_elements = 0
    yield backend
    backend.close()


def assert_rounding_close(got, x, w: QuantTensor):
    """got == x @ w.T within float32 rounding (see the module docstring)."""
    dq = w.dequantize().astype(np.float64)  # [rows, cols]
    x64 = x.astype(np.float64)
    want = x64 @ dq.T
    scale = np.abs(x64) @ np.abs(dq).T  # sum(|w| |x|) per output
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
    xq, step = int8_activations(x, two)
    assert_rounding_close(got, xq, w)
    dq = w.dequantize().astype(np.float64)  # [rows, cols]
    bound = step @ np.abs(dq).T / 2  # [B, rows]: sum_i |w_i| d_i / 2
    err = np.abs(got - x.astype(np.float64) @ dq.T)
    slack = 1e-7 * np.sqrt(w.shape[1]) * (np.abs(x.astype(np.float64)) @ np.abs(dq).T)  # float rounding
    assert (err <= bound + slack).all(), f"max error {(err / bound).max():.3g} x sum|w| d / 2"


def assert_matches(ops, got, x, w: QuantTensor):
    """got == x @ w.T as the kernel that ran promises: float32 rounding, or int8 activations'."""
    mode = ops._int8_mode(w)
    if mode and Q.int_dot(int(WeightKind.of(w))):
        assert_int8_close(got, x, w, mode == 2)
    else:
        assert_rounding_close(got, x, w)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows,blocks", [(1, 1), (2, 3), (7, 2), (33, 5)])
@pytest.mark.parametrize("batch", [1, 2, 3, 7, 16, 17])
def test_linear_matches_dequantised_matmul(ops, name, rows, blocks, batch):
    w = random_blocks(name, rows, width(name, blocks), seed=rows * 31 + blocks, readonly=True)
    x = np.random.default_rng(batch).standard_normal((batch, w.shape[1]), dtype=np.float32)
    got = ops.linear(x, ops.weight(w))
    assert_matches(ops, got, x, w)
    assert_rounding_close(REF.linear(x, REF.weight(w)), x, w)  # the reference meets it too


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("rows,blocks", [(1, 1), (7, 2), (33, 5)])
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 7])
def test_decode_with_and_without_int8_activations(ops, name, mode, rows, blocks, batch, monkeypatch):
    """The decode and few-row kernels of the K-quants: float32 activations (exact), one int8
    row and two, for one activation row and for a few (every pass of four, two and one; where
    x86 has no AVX2 they compile to plain LLVM vector arithmetic: correct, if slow).
    Activations of every scale, a zero run and a lone spike."""
    monkeypatch.setattr(ops, "int8_activations", mode > 0)
    w = random_blocks(name, rows, width(name, blocks), seed=rows + blocks, readonly=True)
    w.outlier_inputs = mode == 2  # a remainder row too
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((batch, w.shape[1]), dtype=np.float32)
    x *= rng.choice([1e-6, 1.0, 1e4], (batch, w.shape[1] // 256)).repeat(256, axis=1).astype(np.float32)
    x[0, :256] = 0.0  # dx = 0: every qx 0
    if blocks > 1:
        x[-1, 300] = 1e3  # one value sets the scale of its 256
    got = ops.linear(x, ops.weight(w))
    if mode:
        assert_int8_close(got, x, w, mode == 2)
    else:
        assert_rounding_close(got, x, w)


@pytest.mark.parametrize("two", [False, True])
@pytest.mark.parametrize("cols", [256, 576, 2048])
def test_int8_activation_rows(two, cols):
    """qdot.quantize: each row's units of 256 (the last of 576 is 64), scale max|x| / 127 per
    unit, every value within half a step of the last row's scale, the sums per 16 those of the
    dequantised values; a zero unit gets scale 0."""
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((3, cols)) * 10.0 ** rng.integers(-3, 4, (3, 1))).astype(np.float32)
    x[1, :256] = 0.0
    x8, r8, dx, dr, s16 = qdot.quantize(x, two)
    units = -(-cols // 256)
    assert x8.shape == (3, cols) and dx.shape == (3, units) and s16.shape == (3, cols // 16)
    assert (r8.shape, dr.shape) == (((3, cols), (3, units)) if two else ((0, cols), (0, units)))
    for u in range(units):
        amax = np.abs(x[:, 256 * u:256 * (u + 1)]).max(axis=1)
        assert np.allclose(dx[:, u], amax / 127, rtol=1e-6)
    assert dx[1, 0] == 0 and not x8[1, :256].any()
    deq, step = int8_activations(x, two)
    assert (np.abs(deq - x) <= step / 2 * (1 + 1e-6) + 1e-30).all()
    assert np.allclose(s16, deq.reshape(3, -1, 16).sum(axis=2), rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("outliers", [False, True])
def test_int8_rows_do_not_depend_on_their_batch(ops, name, outliers, monkeypatch):
    """With int8 activations a row's product is the same alone (decode), among a few (a batched
    step) and among many (a prefill), up to float32 rounding: every row is quantized on its
    own and multiplied the same way, so a sequence's logits do not depend on how its tokens
    were grouped into steps."""
    monkeypatch.setattr(ops, "int8_activations", True)
    w = random_blocks(name, 37, width(name, 3), seed=2, readonly=True)
    w.outlier_inputs = outliers
    kept = ops.weight(w)
    x = np.random.default_rng(5).standard_normal((40, w.shape[1]), dtype=np.float32)
    alone = np.concatenate([ops.linear(x[b:b + 1], kept) for b in range(len(x))])
    scale = np.abs(x) @ np.abs(w.dequantize()).T
    for batch in (2, 5, 16, 40):
        got = ops.linear(x[:batch], kept)
        assert (np.abs(got - alone[:batch]) <= 1e-6 * scale[:batch]).all(), batch


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("int8,outliers", [(False, False), (True, False), (True, True)])
def test_prefill_tiles_and_partial_tiles(ops, name, int8, outliers, monkeypatch):
    """Many activation rows: dequantised tiles into sgemm, with a last tile that is short; or,
    for Q4_K and Q6_K with int8 activations, their integer kernel over every row, with the
    remainder row for a weight whose inputs carry outliers."""
    from inferno.backends.numba import pool, simd
    monkeypatch.setattr(ops, "int8_activations", int8)
    monkeypatch.setattr(simd, "prefill_tile", lambda cols: 16)
    monkeypatch.setattr(pool, "prefill_tile", lambda cols: 16)
    w = random_blocks(name, 41, width(name, 2), seed=5)
    w.outlier_inputs = outliers
    x = np.random.default_rng(0).standard_normal((40, w.shape[1]), dtype=np.float32)
    assert_matches(ops, ops.linear(x, ops.weight(w)), x, w)


@pytest.mark.parametrize("name", TYPES)
def test_embedding_is_the_dequantised_rows(ops, name):
    w = random_blocks(name, 50, width(name, 2), seed=3, readonly=True)
    ids = np.array([0, 49, 7, 7, 23])
    want = w.dequantize()[ids]
    assert np.array_equal(ops.embedding(ops.weight(w), ids), want)
    assert np.array_equal(REF.embedding(REF.weight(w), ids), want)


def test_embedding_rejects_ids_outside_the_table(ops):
    w = ops.weight(random_blocks("Q8_0", 4, 32))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        ops.embedding(w, np.array([1, 4]))


@pytest.mark.parametrize("name", TYPES)
def test_dequant_rows_is_bit_exact(name):
    w = random_blocks(name, 9, width(name, 3), seed=11)
    out = np.full(w.shape, np.nan, dtype=np.float32)
    Q.dequant_rows(int(WeightKind[name]), w.data, out, 2, 9)
    assert np.array_equal(out[:7], w.dequantize(2, 9))


def test_linear_many_fuses_mixed_types(ops):
    """q/k/v-like weights of three types and row counts in one launch (pool), batch 1 and 3."""
    cols = 512
    ws = [random_blocks("Q4_1", 9, cols, seed=1), random_blocks("Q6_K", 5, cols, seed=2),
          random_blocks("Q8_0", 16, cols, seed=3, readonly=True)]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, cols), dtype=np.float32)
        outs = ops.linear_many(x, [ops.weight(w) for w in ws])
        assert len(outs) == 3
        for got, w in zip(outs, ws):
            assert_matches(ops, got, x, w)


def test_linear_rejects_a_mismatched_width(ops):
    """The kernels read without bounds checks, so the width is checked before any launch."""
    w = ops.weight(random_blocks("Q4_0", 4, 64))
    x = np.ones((1, 32), dtype=np.float32)
    with pytest.raises(ValueError, match="32 columns, the weight 64"):
        ops.linear(x, w)
    with pytest.raises(ValueError, match="32 columns"):
        ops.linear_many(x, [w, w])


def test_weight_keeps_the_blocks_in_place(ops):
    """A read-only view (a memory-mapped file) is used as is; a writable one gets a read-only
    view of the same memory, never a copy; float32 memmap-like views are not copied either."""
    w = random_blocks("Q4_1", 4, 64, readonly=True)
    assert ops.weight(w).data is w.data
    w = random_blocks("Q4_1", 4, 64)
    kept = ops.weight(w)
    assert np.shares_memory(kept.data, w.data) and not kept.data.flags.writeable
    f32 = np.ones((4, 64), dtype=np.float32)
    f32.flags.writeable = False
    assert np.shares_memory(ops.weight(f32), f32)


def test_sixteen_bit_rows_not_in_groups_of_32_become_float32(ops):
    w = random_blocks("BF16", 3, 40)
    kept = ops.weight(w)
    assert isinstance(kept, np.ndarray) and np.array_equal(kept, w.dequantize())
    x = np.random.default_rng(0).standard_normal((2, 40), dtype=np.float32)
    assert_rounding_close(ops.linear(x, kept), x, w)


def test_weight_nbytes_counts_the_bytes_a_step_reads(ops):
    w = random_blocks("Q4_1", 4, 64)
    assert ops.weight_nbytes(ops.weight(w)) == 4 * 2 * 20
    assert ops.weight_nbytes(ops.weight(np.ones((4, 64), dtype=np.float32))) == 4 * 64 * 4


def test_reference_linear_tiles_bound_memory(monkeypatch):
    """The reference dequantises a few rows at a time and still gets every row."""
    from inferno.backends import base
    monkeypatch.setattr(base, "QUANT_TILE", 3 * 64)  # three rows of 64 per tile
    w = random_blocks("Q5_1", 10, 64, seed=4)
    x = np.random.default_rng(0).standard_normal((2, 64), dtype=np.float32)
    assert_rounding_close(REF.linear(x, w), x, w)


# -- the reference against llama.cpp's own formats -------------------------------------------------
@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_gguf_quantize_round_trips(name):
    """gguf's quantizers (ports of ggml-quants.c's reference ones) write blocks that our
    reference reads back within half a quantization step of the original weights (Q4_0 and
    Q5_0 clip the weight opposite their largest one to the last level: one step)."""
    w = np.random.default_rng(0).standard_normal((8, 256), dtype=np.float32)
    data = gguf_quantize(w, GGMLQuantizationType[name])
    back = QuantTensor(name, w.shape, data).dequantize().reshape(-1, 32)
    blocks = w.reshape(-1, 32)
    if name == "Q8_0":
        step, bound = np.abs(blocks).max(axis=1) / 127, 0.5
    elif name in ("Q4_0", "Q5_0"):
        step, bound = np.abs(blocks).max(axis=1) / (8 if name == "Q4_0" else 16), 1.0
    else:
        step, bound = (blocks.max(axis=1) - blocks.min(axis=1)) / (15 if name == "Q4_1" else 31), 0.5
    # d and m are stored as float16 (relative error 2^-11): q * d moves by up to 2^-11 of the
    # block's range, m by 2^-11 of itself (up to 127 steps' worth of d for Q8_0).
    drift = 3 * np.abs(blocks).max(axis=1) * 2.0 ** -11
    err = (np.abs(back - blocks).max(axis=1) - drift) / step
    assert err.max() <= bound, err.max()


# -- quantizing float32 weights (--weights q8_0 / q4_0) --------------------------------------------
@pytest.mark.parametrize("name", ["q8_0", "q4_0"])
def test_quantize_writes_ggufs_bytes(name):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((40, 96), dtype=np.float32) * rng.choice([1e-4, 1.0, 7e4], (40, 1))
    w[0, :32] = 0  # a zero block: d = 0, every q 0 (Q4_0: 8)
    w[1, :32] = np.linspace(-1, 1, 32)  # halves: ties round away from zero
    w[2, 32:64] = 3.0
    w[2, 40] = -3.0  # equal magnitudes: Q4_0 takes the first as its sign
    w[3, :32] = np.float32(1e-6)  # d below float16's normals
    got = quantize(w.astype(np.float32), name)
    assert got.qtype.name == name.upper() and got.shape == w.shape
    assert np.array_equal(got.data, gguf_quantize(w.astype(np.float32), GGMLQuantizationType[name.upper()]))


def test_quantize_refuses_what_it_cannot_do():
    with pytest.raises(InfernoError, match="q4_1"):
        quantize(np.ones((2, 32), np.float32), "q4_1")
    with pytest.raises(InfernoError, match="40 columns"):
        quantize(np.ones((2, 40), np.float32), "q8_0")


# -- torch: dequantised once, at load ----------------------------------------------------------------
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_torch_dequantises_at_load(name, dtype):
    torch = pytest.importorskip("torch")
    from inferno.backends.torch.torch_backend import TorchBackend
    ops = TorchBackend(device="cpu", dtype=dtype)
    w = random_blocks(name, 9, width(name, 2), seed=7, readonly=True)
    t = ops.weight(w)
    want = torch.from_numpy(w.dequantize()).to(ops.dtype)
    assert t.dtype == ops.dtype and torch.equal(t, want)
    assert torch.equal(ops.embedding(t, np.array([8, 0, 8])), want[[8, 0, 8]])
    assert ops.weight_nbytes(t) == w.shape[0] * w.shape[1] * t.element_size()
    if dtype == "f32":
        x = np.random.default_rng(0).standard_normal((3, w.shape[1]), dtype=np.float32)
        assert_rounding_close(ops.to_numpy(ops.linear(ops.from_numpy(x), t)), x, w)


def test_fast_dequantize_matches_reference_for_odd_sixteen_bit_rows():
    w = random_blocks("F16", 5, 40)
    assert np.array_equal(Q.dequantize(w, 1, 4), w.dequantize(1, 4))


# -- a folder quantized at load (`--weights`) -------------------------------------------------
@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_a_folder_quantized_at_load(tmp_path, qtype, capsys):
    """--weights quantizes every float matrix whose rows are whole 32-weight blocks, exactly as
    quantize() does, leaves the others, and the model runs on the blocks."""
    from tiny import make_model

    import inferno
    from inferno.engine import Engine, quantize_weights
    from inferno.model.loader import open_checkpoint

    folder = make_model(tmp_path / "m", "llama", hidden=64, heads=4, kv_heads=2, intermediate=96,
                        dtype="bfloat16")
    ref = inferno.load(folder, backend="cpu", progress=False)
    eng = inferno.load(folder, backend="cpu", weights=qtype, progress=False)
    assert "note: quantized" in capsys.readouterr().err
    assert eng.weight_type == qtype.upper()
    w = eng.model.layers[0].down_proj  # [64, 96]: whole blocks
    raw = open_checkpoint(folder).tensors["model.layers.0.mlp.down_proj.weight"].dequantize()
    assert w.qtype.name == qtype.upper() and np.array_equal(w.data, quantize(raw, qtype).data)
    # The oracle: the same blocks dequantized by gguf and run as float32 weights.
    ck = open_checkpoint(folder)
    quantize_weights(ck, qtype)
    ck.tensors = {n: t.dequantize() if getattr(t, "qtype", None) is QTYPES[qtype.upper()] else t
                  for n, t in ck.tensors.items()}
    ids = list(range(3, 40))
    want = Engine(ck, CpuBackend(), warm_up=False).logits(ids)
    got = eng.logits(ids)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    assert np.abs(got - ref.logits(ids)).max() > 1e-3  # and the weights did change
    with pytest.raises(InfernoError, match="weights must be one of"):
        inferno.load(folder, weights="q2_k", progress=False)
