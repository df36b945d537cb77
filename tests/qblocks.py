"""Random GGML blocks built byte by byte, for the quantized-kernel tests and benchmarks.

Every byte of a block is random except its float16 scale fields, which are set to finite values
(GGUF files hold no inf or NaN scales): random ones, zeros, the extremes of float16 (65504, the
smallest normal and subnormal), negative mins. Quant bytes run through all 256 values, so every
nibble and every sign occurs.
"""

from __future__ import annotations

import numpy as np

from inferno.formats.quant import QTYPES, QuantTensor

# Byte offsets of the float16 fields in each type's block (scales d, mins m, K-quants' dmin).
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
              "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
EXTREMES = np.array([0.0, 65504.0, -65504.0, 6.103515625e-05, 5.960464477539063e-08, -1.0],
                    dtype=np.float16)


def random_blocks(name: str, rows: int, cols: int, seed: int = 0, extremes: bool = True,
                  readonly: bool = False) -> QuantTensor:
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
    data = data.reshape(rows, qtype.row_bytes(cols))
    if readonly:
        data.flags.writeable = False
    return QuantTensor(name, (rows, cols), data)
