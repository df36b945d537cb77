"""Quantized weights apart from the ops: the int8 activation rows (qdot.quantize), the kernels'
dequantisation bit for bit, how simd and pool keep a weight (in place, read-only; 16-bit rows
not in groups of 32 as float32) and count its bytes, torch's dequantisation at load; then the
formats: gguf's quantizers read back by the reference, `--weights` quantizing as gguf does, a
folder quantized at load.

Weights are random blocks built byte by byte (qblocks.py, which also holds the bounds a product
with them must meet: float32 rounding, or what int8 activations may cost). The products
themselves, linear, linear_many and embedding of every type on every backend, are in tests/ops/.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize
from qblocks import assert_rounding_close, int8_activations, random_blocks, width

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


@pytest.mark.parametrize("two", [False, True])
@pytest.mark.parametrize("cols", [256, 576, 2048])
def test_int8_activation_rows(two, cols):
    """qdot.quantize: each row's units of 256 (the last of 576 is 64), scale max|x| / 127 per
    unit, every value within half a step of the last row's scale; a zero unit gets scale 0. The
    integer sums per unit: lanes 0-7 zero, then per 32, then per 16, of x8 (and after all of
    x8's, of r8), units past a short row's end zero."""
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((3, cols)) * 10.0 ** rng.integers(-3, 4, (3, 1))).astype(np.float32)
    x[1, :256] = 0.0
    x8, r8, dx, dr, isum = qdot.quantize(x, two)
    units = -(-cols // 256)
    assert x8.shape == (3, cols) and dx.shape == (3, units) and isum.shape == (3, 32 * units * (1 + two))
    assert (r8.shape, dr.shape) == (((3, cols), (3, units)) if two else ((0, cols), (0, units)))
    for u in range(units):
        amax = np.abs(x[:, 256 * u:256 * (u + 1)]).max(axis=1)
        assert np.allclose(dx[:, u], amax / 127, rtol=1e-6)
    assert dx[1, 0] == 0 and not x8[1, :256].any()
    deq, step = int8_activations(x, two)
    assert (np.abs(deq - x) <= step / 2 * (1 + 1e-6) + 1e-30).all()
    for q, sums in ((x8, isum[:, :32 * units]),) + (((r8, isum[:, 32 * units:]),) if two else ()):
        padded = np.zeros((3, 256 * units), np.int64)
        padded[:, :cols] = q
        sums = sums.reshape(3, units, 32)
        assert not sums[:, :, :8].any()
        assert np.array_equal(sums[:, :, 8:16], padded.reshape(3, units, 8, 32).sum(axis=3))
        assert np.array_equal(sums[:, :, 16:], padded.reshape(3, units, 16, 16).sum(axis=3))


@pytest.mark.parametrize("name", TYPES)
def test_dequant_rows_is_bit_exact(name):
    w = random_blocks(name, 9, width(name, 3), seed=11)
    out = np.full(w.shape, np.nan, dtype=np.float32)
    Q.dequant_rows(int(WeightKind[name]), w.data, out, 2, 9)
    assert np.array_equal(out[:7], w.dequantize(2, 9))


def _every_scale_byte(rows: int = 32) -> QuantTensor:
    """MXFP4 blocks whose scale bytes run through all 256 values (e 0 and 1: subnormal scales;
    from 250 on, weights of 12 that overflow to inf as gguf's do), random nibbles."""
    data = np.random.default_rng(0).integers(0, 256, (rows * 8, 17), dtype=np.uint8)  # 8 blocks a row
    data[:, 0] = np.resize(np.arange(256, dtype=np.uint8), rows * 8)
    return QuantTensor("MXFP4", (rows, 256), data.reshape(rows, 8 * 17))


def test_mxfp4_is_ggmls_e2m1_times_a_power_of_two():
    """The reference (the gguf package) is ggml's MXFP4: weight j of a block is kvalues[q]
    2^(e - 128), q the low nibble of byte 1 + j (the high one of byte 1 + j - 16 for j >= 16);
    and the kernels' decoders give it bit for bit on every scale byte: the float32 kernels'
    (dequant_rows) and the int16 kernels' (ldot: the table in int16, eight scales a vector)."""
    import numba as nb
    from inferno.backends.numba import ilanes, lanes

    w = _every_scale_byte()
    blocks = w.data.reshape(-1, 17)
    q = np.concatenate([blocks[:, 1:] & 15, blocks[:, 1:] >> 4], axis=1)  # [blocks, 32] in order
    kvalues = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float64)
    with np.errstate(over="ignore"):
        want = np.ldexp(kvalues[q], blocks[:, :1].astype(np.int64) - 128).astype(np.float32).reshape(w.shape)
        got = w.dequantize()
    assert np.isinf(want).any() and (np.abs(want[want != 0]) < np.finfo(np.float32).tiny).any()
    np.testing.assert_array_equal(got, want)
    out = np.full(w.shape, np.nan, dtype=np.float32)
    Q.dequant_rows(int(WeightKind.MXFP4), w.data, out, 0, w.shape[0])
    np.testing.assert_array_equal(out, want)

    @nb.njit
    def int16_decoders(f, scales, ints):
        for b in range(256):
            o = 17 * b
            if b % 8 == 0:
                eight = ilanes.e8m0vec8(f, o, o + 17, o + 34, o + 51, o + 68, o + 85, o + 102, o + 119)
                ilanes.fstore8(scales, b, eight)
            ilanes.vstore_i16(ints, 32 * b, ilanes.ifloat(ilanes.wfp4(f, o + 1, False)))
            ilanes.vstore_i16(ints, 32 * b + 16, ilanes.ifloat(ilanes.wfp4(f, o + 1, True)))
        return lanes.e8m0at(f, 17 * 255)

    scales, ints = np.empty(256, np.float32), np.empty(256 * 32, np.int16)
    last = int16_decoders(w.data.reshape(-1), scales, ints)
    np.testing.assert_array_equal(scales, np.ldexp(1.0, np.arange(256) - 128).astype(np.float32))
    assert last == np.float32(2.0 ** 127)
    np.testing.assert_array_equal(ints, kvalues[q[:256]].reshape(-1))


@pytest.mark.parametrize("fp4", [False, True], ids=["nibbles", "mxfp4"])
def test_dealt_blocks_multiply_as_in_weight_order(fp4):
    """ilanes' dealt decoders (a 4-bit block's 32 weights as int16 lanes in the order DEALT,
    ldot._l_dealt's blocks) times activations put in that order by hdeal, summed by zisums8: each
    block's integer sum equals numpy's over the weights in their own order, exactly. Nibble q is
    weight i's low nibble of byte i and weight i + 16's high one; MXFP4's values come plus 12."""
    import numba as nb
    from inferno.backends.numba import ilanes, lanes

    rng = np.random.default_rng(3)
    f = rng.integers(0, 256, 16 * 64, dtype=np.uint8)  # 64 blocks' nibble bytes
    x = rng.integers(-20000, 20001, 32 * 64).astype(np.int16)  # sums stay exact in float32

    @nb.njit
    def block(f, g, xd):
        w = ilanes.zwfp4_dealt(f, 16 * g) if fp4 else ilanes.zwnib_dealt(f, 16 * g)
        return ilanes.maddwd(w, ilanes.zhload(xd, 32 * g))

    @nb.njit
    def sums(f, x):
        xd = np.empty_like(x)
        for g in range(64):
            ilanes.hdeal(x, 32 * g, xd, 32 * g)
        out = np.empty(64, np.float32)
        for g in range(0, 64, 8):
            s = ilanes.zisums8(block(f, g, xd), block(f, g + 1, xd), block(f, g + 2, xd), block(f, g + 3, xd),
                               block(f, g + 4, xd), block(f, g + 5, xd), block(f, g + 6, xd), block(f, g + 7, xd))
            ilanes.fstore8(out, g, ilanes.ifloat(s))
        return out

    q = f.reshape(64, 16)
    q = np.concatenate([q & 15, q >> 4], axis=1)  # [blocks, 32], weight order
    if fp4:
        q = np.array(lanes.MXFP4_VALUES)[q] + 12
    want = (q.astype(np.int64) * x.reshape(64, 32)).sum(axis=1)
    np.testing.assert_array_equal(sums(f, x), want.astype(np.float32))
    assert sorted(ilanes.DEALT) == list(range(32))


def test_pext_without_bmi2_is_pexts_runs():
    """lpanels' repack packs nibbles with pext; without BMI2 it is a shift and a mask for each
    run of the mask's ones (ilanes.mask_runs): the same bits as pext's definition, bit by bit."""
    from inferno.backends.numba import ilanes, lpanels

    def pext(x, mask):  # the instruction's definition
        out, at = 0, 0
        for bit in range(64):
            if (mask >> bit) & 1:
                out |= ((x >> bit) & 1) << at
                at += 1
        return out

    def by_runs(x, mask):
        return sum(((x >> bit) & ((1 << n) - 1)) << at for bit, n, at in ilanes.mask_runs(mask))

    rng = np.random.default_rng(5)
    masks = [lpanels.EVEN_LOW, lpanels.ODD_LOW, lpanels.EVEN_HIGH, lpanels.ODD_HIGH, 2 ** 64 - 1, 1 << 63, 0,
             *(int(m) for m in rng.integers(0, 2 ** 63, 20, dtype=np.uint64))]
    for mask in masks:
        for x in (0, 2 ** 64 - 1, *(int(v) for v in rng.integers(0, 2 ** 63, 20, dtype=np.uint64) * 2 + 1)):
            assert by_runs(x, mask) == pext(x, mask), (hex(x), hex(mask))
    assert ilanes.mask_runs(lpanels.ODD_LOW) == [(8, 4, 0), (24, 4, 4), (40, 4, 8), (56, 4, 12)]


def test_mxfp4_from_hf_is_transformers_dequantisation():
    """Hugging Face's gpt-oss layout (`*_blocks` [experts, out, in / 32, 16], `*_scales`
    [experts, out, in / 32]) re-paired into ggml's blocks: the same values as transformers'
    convert_moe_packed_tensors, on every scale byte and nibble (its -0.0 is ggml's +0)."""
    torch = pytest.importorskip("torch")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from inferno.formats.quant import mxfp4_from_hf

    experts, out, groups = 2, 8, 16
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (experts, out, groups, 16), dtype=np.uint8)
    scales = rng.permutation(np.resize(np.arange(256, dtype=np.uint8), experts * out * groups))
    scales = scales.reshape(experts, out, groups)
    want = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    want = want.transpose(1, 2).reshape(experts * out, groups * 32).numpy()  # [experts * out, in]
    w = QuantTensor("MXFP4", (experts * out, groups * 32), mxfp4_from_hf(blocks, scales))
    with np.errstate(over="ignore"):
        got = w.dequantize()
    assert np.isinf(want).any()
    assert np.array_equal(got, want)  # (-0.0 == 0.0)
    with pytest.raises(InfernoError, match="MXFP4 blocks"):
        mxfp4_from_hf(blocks[..., :8], scales)


def test_weight_keeps_the_blocks_in_place(ops):
    """A read-only view (a memory-mapped file) is used as is; a writable one gets a read-only
    view of the same memory, never a copy; float32 memmap-like views are not copied either."""
    w = random_blocks("Q4_1", 4, 64, readonly=True)
    assert ops.weight(w).data is w.data
    w = random_blocks("Q4_1", 4, 64, readonly=False)
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
    from inferno.loading.loader import open_checkpoint

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
    quantize_weights(ck, qtype, CpuBackend())
    ck.tensors = {n: t.dequantize() if getattr(t, "qtype", None) is QTYPES[qtype.upper()] else t
                  for n, t in ck.tensors.items()}
    ids = list(range(3, 40))
    want = Engine(ck, CpuBackend(), warm_up=False).logits(ids)
    got = eng.logits(ids)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    assert np.abs(got - ref.logits(ids)).max() > 1e-3  # and the weights did change
    with pytest.raises(InfernoError, match="weights must be one of"):
        inferno.load(folder, weights="q2_k", progress=False)


@pytest.mark.parametrize("tied", [True, False])
def test_heavy_tailed_inputs_are_marked(tmp_path, tied):
    """The weights whose inputs carry outliers take a remainder row with int8 activations
    (decoder.heavy_tailed_inputs): o_proj, down_proj and the head, tied to the embedding or
    not (one int8 row on SmolLM2's head changed its greedy answers); the others keep one row."""
    from tiny import make_model

    import inferno

    folder = make_model(tmp_path / "m", "llama", hidden=64, heads=4, kv_heads=2, intermediate=96,
                        tied=tied)
    m = inferno.load(folder, backend="cpu", weights="q8_0", progress=False).model
    assert m.lm_head.outlier_inputs and (m.lm_head is m.embed_tokens) == tied
    for layer in m.layers:
        assert layer.o_proj.outlier_inputs and layer.down_proj.outlier_inputs
        assert not any(w.outlier_inputs for w in layer.qkv + layer.gate_up)


def test_the_reference_keeps_dequantised_tiles_within_its_budget():
    """The numpy reference's linear keeps a weight's dequantised tiles for its next call, and a
    weight past its budget is dequantised at each call as before: the same products either way."""
    w = random_blocks("Q4_K", 48, 512, seed=4)
    x = np.random.default_rng(4).standard_normal((3, 512), dtype=np.float32)
    want = x @ w.dequantize().T
    kept = CpuBackend()
    first, again = kept.linear(x, w), kept.linear(x, w)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-4)
    assert list(kept._dequantised) == [id(w)] and kept._dequantised_bytes == 4 * 48 * 512
    tight = CpuBackend()
    tight.KEEP_DEQUANTISED = 4 * 48 * 512 - 1
    np.testing.assert_array_equal(tight.linear(x, w), first)
    assert not tight._dequantised
