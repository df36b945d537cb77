"""Safetensors folders: 16-bit matrices stay 16-bit (QuantTensor views of the file), F32 ones are
read-only views, vectors float32 copies; a header that lies about the file is one InfernoError."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from tiny import make_model

from inferno.formats.quant import QuantTensor
from inferno.errors import InfernoError
from inferno.formats.safetensors import SafetensorsFile, load_folder_tensors


@pytest.mark.parametrize("dtype, qtype", [("bfloat16", "BF16"), ("float16", "F16"), ("float32", None)])
def test_matrices_stay_as_stored(dtype, qtype, tmp_path):
    from safetensors.torch import load_file  # torch widens bf16 to float32 exactly

    folder = make_model(tmp_path / dtype, "qwen3", hidden=32, heads=2, kv_heads=1, dtype=dtype)
    want = {k: v.float().numpy() for k, v in load_file(str(folder / "model.safetensors")).items()}
    got = load_folder_tensors(folder)
    assert got.keys() == want.keys()
    for name, w in got.items():
        if want[name].ndim == 1:  # norms: float32 copies
            assert isinstance(w, np.ndarray) and w.dtype == np.float32 and w.flags.writeable
        elif qtype:
            assert isinstance(w, QuantTensor) and w.qtype.name == qtype and w.shape == want[name].shape
            assert not w.data.flags.owndata  # a view of the file
            w = w.dequantize()
        else:
            assert w.dtype == np.float32 and not w.flags.writeable and not w.flags.owndata
        np.testing.assert_array_equal(w, want[name], err_msg=name)


def _file(tmp_path, raw: bytes, data: bytes = bytes(64), header_len: int | None = None):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def _entry(dtype="F32", shape=(2, 4), offsets=(0, 32)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


CASES = {
    "shorter than its length field": (b"\x01\x02", None, "3 bytes, shorter than the header length"),
    "header longer than the file": ({"w": _entry()}, 10**6, "a header of 1000000 bytes in a file of"),
    "header not JSON": (b"{not json", None, "header is not JSON"),
    "header not an object": ([1, 2], None, "header is not a JSON object"),
    "entry not an object": ({"w": 3}, None, "tensor w has no dtype, shape and data_offsets"),
    "unknown dtype": ({"w": _entry(dtype="I64")}, None, "tensor w has dtype 'I64'; inferno reads F32, F16, BF16, F64"),
    "name not a name": ({"a\nb": _entry()}, None, "a tensor name 'a\\nb' is not a name"),
    "negative dimension": ({"w": _entry(shape=(2, -4))}, None, "tensor w has shape [2, -4]"),
    "boolean dimension": ({"w": _entry(shape=(True, 8))}, None, "tensor w has shape [True, 8]"),
    "offsets reversed": ({"w": _entry(offsets=(32, 0))}, None, "tensor w has data_offsets [32, 0]"),
    "offsets not numbers": ({"w": _entry(offsets=("0", 32))}, None, "data_offsets ['0', 32]"),
    "past the end": ({"w": _entry(shape=(2, 400), offsets=(0, 3200))}, None, "tensor w runs past the end"),
    "size not the shape's": ({"w": _entry(offsets=(0, 16))}, None, "tensor w is 16 bytes, but F32 [2, 4] needs 32"),
    "overlapping": ({"a": _entry(), "b": _entry(offsets=(16, 48))}, None, "tensors a and b overlap"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_lie_in_a_header_is_one_line(case, tmp_path):
    header, header_len, expected = CASES[case]
    if case == "shorter than its length field":
        path = tmp_path / "model.safetensors"
        path.write_bytes(b"\x01\x02\x03")
    else:
        path = _file(tmp_path, header if isinstance(header, bytes) else json.dumps(header).encode(),
                     header_len=header_len)
    with pytest.raises(InfernoError) as e:
        SafetensorsFile(path)
    message = str(e.value)
    assert expected in message and str(path) in message and len(message.splitlines()) == 1, message


def test_a_valid_header_reads(tmp_path):
    """The control for the cases above: the same builder, nothing wrong."""
    values = np.arange(16, dtype=np.float32)
    path = _file(tmp_path, json.dumps({"a": _entry(), "b": _entry(offsets=(32, 64)),
                                       "__metadata__": {"format": "pt"}}).encode(), values.tobytes())
    f = SafetensorsFile(path)
    np.testing.assert_array_equal(f.load("b"), values[8:].reshape(2, 4))
