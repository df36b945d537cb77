"""Quantized weights: GGML block formats kept as they are stored, multiplied in place.

A `QuantTensor` is a `[rows, cols]` linear weight (Hugging Face `[out, in]` order) whose rows are
runs of GGML blocks: `data` is uint8 `[rows, row_bytes]`, normally a view into a memory-mapped
GGUF file, so loading copies and dequantises nothing. Each backend decides how to multiply it:
the reference dequantises tiles of rows and runs a float32 matmul; the Numba backends read the
blocks directly; the torch backends dequantise once at load to their dtype.

F16 and BF16 weights (a safetensors folder's usual dtypes) are QuantTensors too, with blocks of
one element, so a folder's weights stay at 16 bits on the CPU backends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferno.errors import InfernoError


@dataclass(frozen=True)
class QType:
    name: str  # GGML's spelling: "Q4_K"
    ggml_id: int  # GGMLQuantizationType's value, as stored in a GGUF tensor table
    block: int  # weights per block
    block_bytes: int  # bytes per block

    def row_bytes(self, cols: int) -> int:
        return cols // self.block * self.block_bytes


# GGML type id -> (name, weights per block, bytes per block), ggml.h's table. An id missing here
# is looked up in the gguf package, for types newer than this table.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
    27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}

# The block formats inferno multiplies in place (layouts: ggml's ggml-common.h):
#   Q8_0  f16 d, 32 x int8                   Q4_0  f16 d, 16 bytes of nibbles (low: weights 0-15)
#   Q4_1  f16 d, f16 m, 16 bytes of nibbles  Q5_0  f16 d, 4 bytes of 5th bits, 16 of nibbles
#   Q5_1  f16 d, f16 m, 4 bytes of 5th bits, 16 bytes of nibbles
#   Q4_K  f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 of nibbles; Q5_K: plus 32 of 5th bits
#   Q6_K  128 low nibbles, 64 of 2-bit highs, 16 int8 scales, f16 d
#   MXFP4 E8M0 e, 16 bytes of E2M1 nibbles as Q4_0's; weight = kvalues[q] 2^(e - 128), kvalues
#         the E2M1 values doubled (ggml's kvalues_mxfp4, GGML_E8M0_TO_FP32_HALF: e 0 and 1 subnormal)
KEPT = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "MXFP4")
_BY_NAME = {name: (i, block, size) for i, (name, block, size) in GGML_TYPES.items()}
QTYPES = {name: QType(name, *_BY_NAME[name]) for name in KEPT}
QTYPES_BY_ID = {q.ggml_id: q for q in QTYPES.values()}


class QuantTensor:
    """A `[rows, cols]` weight in a GGML block format; `data` is uint8 `[rows, row_bytes]`."""

    __slots__ = ("qtype", "shape", "data", "outlier_inputs")

    def __init__(self, qtype: QType | str, shape: tuple[int, int], data: np.ndarray,
                 outlier_inputs: bool = False):
        qtype = QTYPES[qtype] if isinstance(qtype, str) else qtype
        rows, cols = (int(d) for d in shape)
        if cols % qtype.block:
            raise InfernoError(f"a {qtype.name} tensor needs rows of whole {qtype.block}-weight "
                               f"blocks, got {cols} columns")
        data = np.asarray(data)
        row_bytes = qtype.row_bytes(cols)
        if data.dtype != np.uint8 or data.size != rows * row_bytes:
            raise InfernoError(f"{qtype.name} data for [{rows}, {cols}] must be {rows * row_bytes} "
                               f"bytes, got {data.size} of {data.dtype}")
        self.qtype = qtype
        self.shape = (rows, cols)
        self.data = data.reshape(rows, row_bytes)  # a view: reshape of a contiguous buffer
        # The model's word that this matrix's inputs are heavy-tailed (the MLP's gated product,
        # the input of down_proj): int8 activations then take a remainder row (qdot.py).
        self.outlier_inputs = outlier_inputs

    @property
    def nbytes(self) -> int:
        return self.data.size

    @property
    def ndim(self) -> int:
        return 2

    def __repr__(self) -> str:
        return f"QuantTensor({self.qtype.name}, {list(self.shape)})"

    def rows(self, r0: int, r1: int) -> "QuantTensor":
        """Rows r0..r1, a view (its inputs are the matrix's: outlier_inputs carries over)."""
        return QuantTensor(self.qtype, (r1 - r0, self.shape[1]), self.data[r0:r1], self.outlier_inputs)

    def take_rows(self, order: np.ndarray) -> "QuantTensor":
        """The rows in `order` (a copy): whole rows of blocks move unchanged."""
        return QuantTensor(self.qtype, (len(order), self.shape[1]), np.ascontiguousarray(self.data[order]),
                           self.outlier_inputs)

    def dequantize(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        """Rows r0..r1 as float32 `[r1 - r0, cols]`: the gguf package's dequantisation, the
        reference every kernel is pinned to."""
        from gguf.quants import dequantize

        r1 = self.shape[0] if r1 is None else r1
        out = dequantize(self.data[r0:r1], self.qtype.ggml_id)
        return np.asarray(out, dtype=np.float32).reshape(r1 - r0, self.shape[1])


def mxfp4_from_hf(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Hugging Face's MXFP4 experts (gpt-oss: `*_blocks` uint8 [..., out, in / 32, 16] and
    `*_scales` uint8 [..., out, in / 32]) as ggml's MXFP4 rows, uint8 [rows, in / 32 * 17], rows
    the product of the leading dims: a QuantTensor("MXFP4", (rows, in), ...)'s data.

    Only the nibbles move: transformers' byte j holds elements 2j (low) and 2j + 1 (high), ggml's
    elements j and j + 16. The scale byte is kept: transformers' value lut[q] 2^(s - 127) (lut
    the E2M1 values 0 .. 6) is ggml's kvalues[q] 2^(s - 128), kvalues = 2 lut. (lut's -0.0 reads
    back as ggml's +0.)"""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    if blocks.ndim < 3 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise InfernoError(f"MXFP4 blocks [..., out, in / 32, 16] and scales [..., out, in / 32] "
                           f"expected, got {list(blocks.shape)} and {list(scales.shape)}")
    *lead, groups, _ = blocks.shape
    rows = int(np.prod(lead))
    q = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(rows, groups, 32)  # in order
    out = np.empty((rows, groups, 17), np.uint8)  # [rows, blocks, 17]
    out[..., 0] = scales.reshape(rows, groups)
    out[..., 1:] = q[..., :16] | (q[..., 16:] << 4)
    return out.reshape(rows, groups * 17)


def as_float32(t) -> np.ndarray:
    """A weight as float32 numpy: a QuantTensor dequantised (small ones: biases a 16-bit file
    keeps as matrices), anything else converted."""
    return t.dequantize() if isinstance(t, QuantTensor) else np.asarray(t, np.float32)


QUANTIZERS = ("q8_0", "q4_0")
