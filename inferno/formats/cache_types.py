"""KV cache element types in numpy: how float32 K/V rows are stored and read back.

The reference for every backend's `kv_buffer` / `write_kv` / `read_kv`. A buffer is a plain
numpy array whose dtype says what it holds, so a kernel can be chosen from the array alone:

| cache type | dtype | one row of `width` features |
| --- | --- | --- |
| f32 | float32 | width floats |
| f16 | float16 | width halves, rounded to nearest even (numpy's astype) |
| bf16 | uint16 | the upper 16 bits of each float32, rounded to nearest even (numpy has no bfloat16) |
| q8_0 | uint8 | GGML Q8_0 blocks along the width: per 32 features an f16 scale d and 32 int8 q, x = d * q |

Q8_0 quantizes as ggml's quantize_row_q8_0_ref (and the gguf package) do: d = max|x| / 127,
q = round-half-away(x / d) computed as x * (1 / d) in float32, then d stored as f16.
"""

from __future__ import annotations

import numpy as np

from inferno.errors import InfernoError

QK8_0 = 32  # features per Q8_0 block
Q8_0_BYTES = 2 + QK8_0  # f16 scale, 32 int8

DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "q8_0": np.uint8}
TYPE_OF_DTYPE = {np.dtype(d): t for t, d in DTYPES.items()}


def check(cache_type: str, width: int) -> None:
    if cache_type not in DTYPES:
        raise InfernoError(f"cache_type {cache_type!r} is not one of: {', '.join(DTYPES)}",
                           params=("cache_type",))
    if cache_type == "q8_0" and width % QK8_0:
        raise InfernoError(f"a q8_0 cache needs a KV width (KV heads x head dim) that is a "
                           f"multiple of {QK8_0}, got {width}; use cache_type f16",
                           params=("cache_type",))


def row_elements(cache_type: str, width: int) -> int:
    """Elements of the buffer's dtype in one row of `width` features."""
    return width // QK8_0 * Q8_0_BYTES if cache_type == "q8_0" else width


def cache_type_of(buf) -> str:
    return TYPE_OF_DTYPE[buf.dtype]


def width_of(buf) -> int:
    """Features per position of a buffer [slots, capacity, row_elements]."""
    return buf.shape[2] // Q8_0_BYTES * QK8_0 if cache_type_of(buf) == "q8_0" else buf.shape[2]


def empty(slots: int, capacity: int, width: int, cache_type: str) -> np.ndarray:
    """A zeroed buffer [slots, capacity, row_elements] (zero bytes read back as 0.0 in every type)."""
    check(cache_type, width)
    return np.zeros((slots, capacity, row_elements(cache_type, width)), DTYPES[cache_type])


# -- float32 rows -> stored rows ------------------------------------------------------------------
def encode(rows: np.ndarray, cache_type: str) -> np.ndarray:
    """float32 [n, width] as the cache type's stored rows."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if cache_type == "bf16":
        return bf16_bits(rows)
    if cache_type == "q8_0":
        return quantize_q8_0(rows)
    with np.errstate(over="ignore"):  # NOTE: past f16's 65504 a value becomes inf, as in llama.cpp
        return rows.astype(DTYPES[cache_type])


def decode(stored: np.ndarray) -> np.ndarray:
    """Stored rows [n, row_elements] back to float32 [n, width]; the type is read off the dtype."""
    cache_type = cache_type_of(stored)
    if cache_type == "bf16":
        return widen_bf16(stored)
    if cache_type == "q8_0":
        return dequantize_q8_0(stored)
    return stored.astype(np.float32)


def widen_bf16(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32: the 16 bits become a float32's top half, exactly."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (NaN stays a quiet NaN)."""
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf (halves away from zero), exactly: floor(|x| + 0.5) rounds 0.49999997 up."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.sign(x) * (whole + np.floor(2 * (a - whole)))


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 [n, width] -> uint8 [n, width // 32 * 34] of Q8_0 blocks."""
    n, width = x.shape
    blocks = x.reshape(-1, QK8_0)  # [n * width / 32, 32]
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = round_half_away(blocks * inv).astype(np.int8)
    out = np.empty((blocks.shape[0], Q8_0_BYTES), np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(n, width // QK8_0 * Q8_0_BYTES)


def dequantize_q8_0(stored: np.ndarray) -> np.ndarray:
    n = stored.shape[0]
    blocks = np.ascontiguousarray(stored).reshape(-1, Q8_0_BYTES)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # [blocks, 1]
    return (blocks[:, 2:].view(np.int8) * d).astype(np.float32).reshape(n, stored.shape[1] // Q8_0_BYTES * QK8_0)
