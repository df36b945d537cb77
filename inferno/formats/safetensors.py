"""A small safetensors reader: header JSON, then each tensor as a view into the memory-mapped
file where it can stay as stored.

Matrices keep their bytes: BF16 and F16 ones become QuantTensor("BF16"/"F16") views (the CPU
backends multiply 16-bit weights in place), F32 ones read-only float32 views. Vectors (norms)
and F64 tensors become float32 copies. Our own reader rather than `safetensors.numpy` because
numpy has no bfloat16, and because every offset is checked against the file first: a tensor
outside the data, overlapping another, or of a size its dtype and shape do not give is a
one-line error, not a crash or a silent misread.
"""

from __future__ import annotations

import json
import math
import mmap
from itertools import chain
from pathlib import Path

import numpy as np

from inferno.formats.cache_types import widen_bf16
from inferno.formats.quant import QuantTensor
from inferno.errors import InfernoError, one_line

# U8: packed blocks kept as bytes (gpt-oss's MXFP4 `*_blocks` and `*_scales`).
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64, "U8": np.uint8}
MAX_HEADER = 100_000_000  # the format's own limit on the JSON header


class SafetensorsFile:
    """One .safetensors file, header parsed and checked; `load(name)` returns a tensor."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = f.seek(0, 2)
            if size < 8:
                raise self.corrupt(f"{size} bytes, shorter than the header length")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        header_len = int.from_bytes(self._map[:8], "little")
        if header_len > min(size - 8, MAX_HEADER):
            raise self.corrupt(f"a header of {header_len} bytes in a file of {size}")
        try:
            header = json.loads(self._map[8:8 + header_len])
        except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError
            raise self.corrupt(f"header is not JSON: {one_line(e, 200)}") from None
        if not isinstance(header, dict):
            raise self.corrupt("header is not a JSON object")
        header.pop("__metadata__", None)
        self._data_start = 8 + header_len
        self.header = {name: self._check(name, info, size - self._data_start)
                       for name, info in header.items()}
        spans = sorted((start, end, name) for name, (_, _, start, end) in self.header.items())
        for (_, a_end, a), (b_start, _, b) in zip(spans, spans[1:]):
            if b_start < a_end:
                raise self.corrupt(f"tensors {a} and {b} overlap")

    def corrupt(self, what: str) -> InfernoError:
        return InfernoError(f"{self.path}: not a readable safetensors file ({what}); download it again")

    def _check(self, name: str, info, data_bytes: int) -> tuple[str, tuple, int, int]:
        """(dtype, shape, start, end) of one header entry, each checked against the file."""
        if len(name) > 256 or not name.isprintable():  # messages name it on one line
            raise self.corrupt(f"a tensor name {name[:80]!r} is not a name")
        if not isinstance(info, dict):
            raise self.corrupt(f"tensor {name} has no dtype, shape and data_offsets")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in _DTYPES:
            raise InfernoError(f"{self.path}: tensor {name} has dtype {dtype!r:.40}; inferno reads "
                               f"{', '.join(_DTYPES)}")
        if not (isinstance(shape, list) and all(_is_index(d) for d in shape)):
            raise self.corrupt(f"tensor {name} has shape {shape!r:.80}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_index, offsets))
                and offsets[0] <= offsets[1]):
            raise self.corrupt(f"tensor {name} has data_offsets {offsets!r:.80}")
        start, end = offsets
        if end > data_bytes:
            raise self.corrupt(f"tensor {name} runs past the end of the file; it is truncated")
        nbytes = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
        if end - start != nbytes:
            raise self.corrupt(f"tensor {name} is {end - start} bytes, but {dtype} {shape} needs {nbytes}")
        return dtype, tuple(shape), start, end

    def names(self) -> list[str]:
        return list(self.header)

    def is_view(self, name: str) -> bool:
        """Whether `load(name)` is a view (no copy, no time)."""
        dtype, shape, _, _ = self.header[name]
        return len(shape) == 2 and dtype != "F64"

    def load(self, name: str) -> QuantTensor | np.ndarray:
        dtype, shape, start, end = self.header[name]
        raw = np.frombuffer(self._map, dtype=np.uint8, count=end - start, offset=self._data_start + start)
        if len(shape) == 2 and dtype in ("BF16", "F16"):
            return QuantTensor(dtype, shape, raw)
        values = raw.view(_DTYPES[dtype]).reshape(shape)
        if self.is_view(name) or dtype == "U8":
            return values  # F32: read-only, like the map
        if dtype == "BF16":
            return widen_bf16(values)
        return values.astype(np.float32)


def _is_index(x) -> bool:
    return type(x) is int and x >= 0  # not a bool, a float or a string


def load_folder_tensors(folder: Path, progress=None) -> dict[str, QuantTensor | np.ndarray]:
    """Every tensor of every *.safetensors file in `folder` (sharded or not). `progress` wraps
    the loop over matrices that must be converted (F64); the rest are views or small vectors."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise InfernoError(f"{folder}: no *.safetensors weights (a model folder holds config.json, "
                           f"*.safetensors and tokenizer.json)")
    handles = [SafetensorsFile(p) for p in files]
    names = [(h, n) for h in handles for n in h.names()]
    slow = [(h, n) for h, n in names if not h.is_view(n) and len(h.header[n][1]) >= 2]
    fast = [(h, n) for h, n in names if h.is_view(n) or len(h.header[n][1]) < 2]
    tensors = {}
    for h, n in chain(fast, progress(slow, desc="converting weights", unit="tensor")
                      if progress and slow else slow):
        if n in tensors:
            raise InfernoError(f"{folder}: tensor {n} is in two .safetensors files")
        tensors[n] = h.load(n)
    return tensors
