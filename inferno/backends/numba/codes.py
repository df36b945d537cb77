"""The two integer codes the Numba kernels branch on, one enum each: a weight's kind (how its
blocks are read) and a KV cache's kind (what one element is stored as).

Both used to be bare integers, and they overlap: weight Q8_0 was 2 and cache Q8_0 3, with simd.py
holding both. As enums a mix-up stops at the first comparison: comparing a WeightKind with a
CacheKind raises TypeError instead of being silently false (or true).

The kernels themselves take plain ints (`int(kind)`, or the module constants each kernel file
derives from these enums): the quantized drivers are specialised on the kind as a compile-time
integer literal, which an enum member would not type as.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from inferno.formats import cache_types
from inferno.formats.quant import QuantTensor


class Code(IntEnum):
    """An IntEnum that refuses comparison with another code's members."""

    def _check(self, other) -> None:
        if isinstance(other, Code) and type(other) is not type(self):
            raise TypeError(f"{self!r} compared with {other!r}: two different codes")

    def __eq__(self, other):
        self._check(other)
        return int(self) == other

    def __ne__(self, other):
        self._check(other)
        return int(self) != other

    __hash__ = IntEnum.__hash__


class WeightKind(Code):
    """How a QuantTensor's blocks are read: one per quant.QTYPES entry the kernels multiply."""

    F16 = 0
    BF16 = 1
    Q8_0 = 2
    Q4_0 = 3
    Q4_1 = 4
    Q5_0 = 5
    Q5_1 = 6
    Q4_K = 7
    Q5_K = 8
    Q6_K = 9
    Q4_KX8 = 10  # Q4_K repacked into panels of eight rows (kpanels.py)
    F32 = 11  # a float32 matrix, not a QuantTensor (fdot.py reads it as bytes, as F16's)
    MXFP4 = 12  # read as a legacy kind (ldot.py): Q4_0's nibbles, a table, a power-of-two scale
    MXFP4X16 = 13  # MXFP4 repacked into panels of sixteen rows (lpanels.py)
    Q4_0X16 = 14  # Q4_0 in panels of sixteen rows (lpanels.py)
    Q4_1X16 = 15  # Q4_1 in panels of sixteen rows (lpanels.py)

    @classmethod
    def of(cls, w: QuantTensor) -> WeightKind:
        return cls[getattr(w, "kind_name", None) or w.qtype.name]


class CacheKind(Code):
    """What one element of a KV cache buffer is stored as: its index in cache_types.DTYPES."""

    F32 = 0
    F16 = 1
    BF16 = 2
    Q8_0 = 3

    @classmethod
    def of(cls, buf: np.ndarray) -> CacheKind:
        return _CACHE_KIND_OF_DTYPE[buf.dtype]  # on every cache op: a dict lookup, no names


_CACHE_KIND_OF_DTYPE = {np.dtype(dtype): CacheKind[name.upper()] for name, dtype in cache_types.DTYPES.items()}
