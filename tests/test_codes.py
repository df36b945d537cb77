"""The kernels' two integer codes: WeightKind (how a weight's blocks are read) and CacheKind (what
a KV cache element is stored as). Pinned: each names exactly the types it serves, the kernel
modules' plain-int constants are its values, and the two cannot be compared with each other."""

from __future__ import annotations

import numpy as np
import pytest

from inferno.backends.numba import kv_kernels as KV
from inferno.backends.numba import qkernels as Q
from inferno.backends.numba.codes import CacheKind, WeightKind
from inferno.formats import cache_types
from inferno.formats.quant import QTYPES, QuantTensor


def test_weight_kinds_are_the_types_the_kernels_read():
    from inferno.backends.numba import kpanels, lpanels
    # every file type the kernels read, the layouts the backends make of Q4_K (kpanels.py) and of
    # Q4_0, Q4_1 and MXFP4 (lpanels.py), and float32 matrices (fdot.py)
    assert set(WeightKind.__members__) - set(QTYPES) == {"Q4_KX8", "Q4_0X16", "Q4_1X16", "MXFP4X16", "F32"}
    for kind in WeightKind:
        assert getattr(Q, kind.name) == int(kind) and type(getattr(Q, kind.name)) is int
    assert len(Q.UNIT_BYTES) == len(WeightKind)  # one unit size per code, in code order
    w = QuantTensor(QTYPES["Q4_K"], (8, 256), np.zeros((8, 144), np.uint8))
    assert WeightKind.of(w) is WeightKind.Q4_K
    assert WeightKind.of(kpanels.repack(w)) is WeightKind.Q4_KX8
    m = QuantTensor(QTYPES["MXFP4"], (16, 32), np.zeros((16, 17), np.uint8))
    assert WeightKind.of(m) is WeightKind.MXFP4
    assert WeightKind.of(lpanels.repack(m)) is WeightKind.MXFP4X16


def test_cache_kinds_are_the_cache_types_in_order():
    assert [k.name.lower() for k in CacheKind] == list(cache_types.DTYPES)
    for kind in CacheKind:
        assert getattr(KV, kind.name) == int(kind) and type(getattr(KV, kind.name)) is int
        buf = cache_types.empty(1, 2, 32, kind.name.lower())
        assert CacheKind.of(buf) is kind


def test_the_two_codes_do_not_mix():
    assert WeightKind.Q8_0 == 2 and CacheKind.Q8_0 == 3  # each still an int to the kernels
    for a, b in [(WeightKind.Q8_0, CacheKind.Q8_0), (CacheKind.F16, WeightKind.BF16)]:
        with pytest.raises(TypeError, match="two different codes"):
            _ = a == b
        with pytest.raises(TypeError, match="two different codes"):
            _ = a != b
    assert {WeightKind.F16: "x"}[0] == "x"  # hashes as its int
    with pytest.raises(ValueError):
        Q.linear_for(len(WeightKind))  # not a weight kind: refused before anything compiles
