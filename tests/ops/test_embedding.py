"""embedding: rows of a table for token ids (repeated and out of order, as a prompt has them).

A float table gives its rows bit for bit. A quantized one, of every GGML type (random blocks,
qblocks.py), gives the dequantised rows bit for bit: the gguf package's dequantisation
(QuantTensor.dequantize); torch dequantises the table once, in weight(). The Numba kernels
index without bounds checks, so an id outside the table stops before them.
"""

from __future__ import annotations

import numpy as np
import pytest
from ops.helpers import NUMBA, assert_exact, host, rand
from qblocks import random_blocks, width

from inferno.formats.quant import QTYPES

IDS = np.array([0, 49, 7, 7, 23])


def test_float_table_rows(backend):
    table = rand(50, 24, seed=1)
    assert_exact(host(backend, backend.embedding(backend.weight(table), IDS)), table[IDS])
    # ids as the backend's own index tensor, as the device-resident decode step passes them
    assert_exact(host(backend, backend.embedding(backend.weight(table), backend.indices(IDS))), table[IDS])


@pytest.mark.parametrize("name", list(QTYPES))
def test_embedding_is_the_dequantised_rows(backend, name):
    w = random_blocks(name, 50, width(name, 2), seed=3, readonly=True)
    want = w.dequantize()[IDS]
    assert_exact(host(backend, backend.embedding(backend.weight(w), IDS)), want)


@pytest.mark.backends(*NUMBA)
def test_embedding_rejects_ids_outside_the_table(backend):
    w = backend.weight(random_blocks("Q8_0", 4, 32))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        backend.embedding(w, np.array([1, 4]))
