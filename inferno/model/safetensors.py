"""A small safetensors reader: header JSON, then each tensor as float32 numpy.

Our own rather than `safetensors.numpy` because numpy has no bfloat16: bf16 is widened here by
moving its 16 bits into the top half of a float32, which is exact.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from inferno.errors import InfernoError

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


class SafetensorsFile:
    """Lazy access to one .safetensors file; `load(name)` returns a float32 array."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                self.header = json.loads(f.read(header_len))
                self._data_start = 8 + header_len
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (struct.error, json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
            raise InfernoError(f"{self.path}: not a readable safetensors file ({e})") from None
        self.header.pop("__metadata__", None)

    def names(self) -> list[str]:
        return list(self.header)

    def load(self, name: str) -> np.ndarray:
        info = self.header[name]
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise InfernoError(f"{self.path}: tensor {name} has dtype {dtype}; inferno reads "
                               f"{', '.join(_DTYPES)}")
        start, end = info["data_offsets"]
        if self._data_start + end > len(self._map):
            raise InfernoError(f"{self.path}: truncated (tensor {name} runs past the end of the file)")
        raw = np.frombuffer(self._map, dtype=_DTYPES[dtype], count=(end - start) // np.dtype(_DTYPES[dtype]).itemsize,
                            offset=self._data_start + start)
        if dtype == "BF16":
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            out = raw.astype(np.float32)
        return out.reshape(info["shape"])


def load_folder_tensors(folder: Path, progress=None) -> dict[str, np.ndarray]:
    """Every tensor of every *.safetensors file in `folder` (sharded or not), as float32."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise InfernoError(f"{folder}: no *.safetensors weights (a model folder holds config.json, "
                           f"*.safetensors and tokenizer.json)")
    handles = [SafetensorsFile(p) for p in files]
    names = [(h, n) for h in handles for n in h.names()]
    tensors = {}
    for h, n in progress(names, desc="loading weights", unit="tensor") if progress else names:
        tensors[n] = h.load(n)
    return tensors
