"""A GGUF file read for untrusted input: header, metadata and tensor table, checked against the
file before anything is allocated, with the data left in one read-only memory map.

    gf = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    gf.metadata["general.architecture"]       # plain Python values: str, int, float, bool, lists
    info = gf.tensors["token_embd.weight"]    # TensorInfo: GGML type, dims innermost first
    blocks = gf.raw(info)                     # uint8 view of its bytes in the map

Layout (ggml's docs/gguf.md): "GGUF", version (2 or 3), tensor count, key-value count; the
key-value pairs; one entry per tensor (name, dims, type, offset from the data section); then
the data section at the next multiple of `general.alignment`. Every count and length read from
the file is checked against the bytes left before it is used, so a corrupted count fails at once
instead of allocating or looping for minutes; every tensor's byte range is checked against its
type and shape, the alignment, the end of the file and every other tensor's range.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferno.formats.quant import GGML_TYPES
from inferno.errors import InfernoError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 256  # characters in a key or tensor name
MAX_NESTING = 8  # arrays of arrays: none in real files, so a small bound against deep recursion

# Metadata value type id -> little-endian scalar format; 8 is a string, 9 an array.
STRING, ARRAY, BOOL = 8, 9, 7
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_SCALAR = {t: struct.Struct("<" + f) for t, f in SCALARS.items()}
_NUMPY = {t: np.dtype("<" + f.replace("?", "u1")) for t, f in SCALARS.items()}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_SEPARATOR = "\x00" * 8  # a zeroed string length, between strings read at once
_MIN_KV = 8 + 4 + 1  # an empty key, a type, a one-byte value
_MIN_TENSOR = 8 + 4 + 8 + 4 + 8  # an empty name, one dim, a type, an offset


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int  # GGML type id
    type_name: str  # "Q4_K"
    shape: tuple[int, ...]  # GGUF order, innermost first: [in, out] for a linear weight
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def row_bytes(self) -> int:
        """Bytes per innermost row (blocks of shape[0] weights)."""
        return self.nbytes // math.prod(self.shape[1:])

    @property
    def hf_shape(self) -> tuple[int, ...]:
        """numpy / Hugging Face order, outermost first: [out, in]."""
        return self.shape[::-1]


class GGUFFile:
    """A parsed GGUF file; tensor bytes stay in the memory map until `raw` views them."""

    def __init__(self, path: Path, buf: mmap.mmap, version: int, metadata: dict,
                 tensors: dict[str, TensorInfo], alignment: int):
        self.path, self.version, self.alignment = path, version, alignment
        self.metadata = metadata
        self.tensors = tensors
        self._buf = buf

    def raw(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes, a read-only uint8 view into the map: `[nbytes]`."""
        return np.frombuffer(self._buf, dtype=np.uint8, count=info.nbytes, offset=info.offset)


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse and check `path`; any fault is one InfernoError naming the file and the fault."""
    path = Path(path)
    if not path.is_file():
        raise InfernoError(f"GGUF file {path} not found")
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise InfernoError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
        size = f.seek(0, 2)
        if size < 24:
            raise corrupt(path, f"the file is {size} bytes, shorter than a GGUF header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return _Parser(path, buf).parse()


# general.file_type -> the name llama-bench gives it (llama.h's llama_ftype, less its MOSTLY_);
# an id missing here is looked up in the gguf package.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
}


def file_type_name(file_type: int) -> str | None:
    """The name of a general.file_type (Q4_K_M), None when unknown."""
    if file_type in FILE_TYPES:
        return FILE_TYPES[file_type]
    try:  # newer than our table
        from gguf import LlamaFileType
        return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (ImportError, ValueError):
        return None


def corrupt(path: Path, what: str) -> InfernoError:
    return InfernoError(f"{path}: truncated or corrupt GGUF file ({what}); download it again")


def ggml_type(type_id: int) -> tuple[str, int, int] | None:
    """(name, weights per block, bytes per block) of a GGML type id, None when unknown."""
    if type_id in GGML_TYPES:
        return GGML_TYPES[type_id]
    try:  # newer than our table: the installed gguf package may know it
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        qtype = GGMLQuantizationType(type_id)
        return (qtype.name, *GGML_QUANT_SIZES[qtype])
    except (ImportError, ValueError, KeyError):
        return None


class _Parser:
    def __init__(self, path: Path, buf: mmap.mmap):
        self.path, self.buf, self.pos, self.end = path, buf, 0, len(buf)

    def parse(self) -> GGUFFile:
        self.pos = 4
        version = self.u32()
        if version not in VERSIONS:
            if version & 0xFFFF == 0 and int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
                raise InfernoError(f"{self.path}: a big-endian GGUF file; inferno reads little-endian "
                                   f"ones (convert the model again without --bigendian)")
            if version == 1:
                raise InfernoError(f"{self.path}: GGUF version 1 (2023) is not supported; convert "
                                   f"the model again with a current llama.cpp")
            raise corrupt(self.path, f"GGUF version {version}; inferno reads versions 2 and 3")
        n_tensors, n_kv = self.u64(), self.u64()
        self.check_count(n_kv, _MIN_KV, "key-value count")
        metadata = {}
        for _ in range(n_kv):
            key = self.name("a metadata key")
            if key in metadata:
                raise corrupt(self.path, f"metadata key {key} appears twice")
            metadata[key] = self.value(self.u32(), key, 0)
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise corrupt(self.path, f"general.alignment is {alignment!r:.40}, not a power of two")
        self.check_count(n_tensors, _MIN_TENSOR, "tensor count")
        entries = [self.tensor_entry() for _ in range(n_tensors)]
        data_start = -(-self.pos // alignment) * alignment
        return GGUFFile(self.path, self.buf, version, metadata,
                        self.check_tensors(entries, data_start, alignment), alignment)

    # -- primitives: each checks the bytes it needs first ---------------------------------------
    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise corrupt(self.path, f"{what} runs past the end of the file at byte {self.pos}")

    def check_count(self, count: int, min_bytes: int, what: str) -> None:
        if count * min_bytes > self.end - self.pos:
            raise corrupt(self.path, f"{what} {count} needs more bytes than the file has left "
                                     f"at byte {self.pos}")

    def u32(self) -> int:
        self.need(4, "a 32-bit field")
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self) -> int:
        self.need(8, "a 64-bit field")
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        n = self.u64()
        self.need(n, f"{what} of {n} bytes")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return self.decode(raw, what)

    def name(self, what: str) -> str:
        """A key or tensor name: short and printable, so that every message naming it stays
        one short line (llama.cpp's tensor names are under 64 bytes)."""
        s = self.string(what)
        if len(s) > MAX_NAME or not s.isprintable():
            raise corrupt(self.path, f"{what} {s[:80]!r} is not a name: longer than {MAX_NAME} "
                                     f"characters, or not printable")
        return s

    def decode(self, raw, what: str) -> str:
        """UTF-8 bytes (or any buffer of them) as text."""
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise corrupt(self.path, f"{what} is not valid UTF-8") from None

    # -- metadata values ------------------------------------------------------------------------
    def value(self, vtype: int, key: str, depth: int):
        if vtype in _SCALAR:
            fmt = _SCALAR[vtype]
            self.need(fmt.size, f"the value of {key}")
            (v,) = fmt.unpack_from(self.buf, self.pos)
            self.pos += fmt.size
            return v
        if vtype == STRING:
            return self.string(f"the value of {key}")
        if vtype == ARRAY:
            return self.array(key, depth + 1)
        raise corrupt(self.path, f"metadata {key} has unknown value type {vtype}")

    def array(self, key: str, depth: int) -> list:
        if depth > MAX_NESTING:
            raise corrupt(self.path, f"metadata {key} nests arrays {depth} deep")
        etype, n = self.u32(), self.u64()
        if etype in _NUMPY:
            dtype = _NUMPY[etype]
            self.check_count(n, dtype.itemsize, f"metadata {key}: array length")
            a = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos)
            self.pos += n * dtype.itemsize
            return (a != 0).tolist() if etype == BOOL else a.tolist()
        if etype == STRING:
            self.check_count(n, 8, f"metadata {key}: array length")
            return self.strings(n, key)
        if etype == ARRAY:
            self.check_count(n, 12, f"metadata {key}: array length")
            return [self.array(key, depth + 1) for _ in range(n)]
        raise corrupt(self.path, f"metadata {key} is an array of unknown value type {etype}")

    def strings(self, n: int, key: str) -> list[str]:
        """n length-prefixed strings: a vocabulary or merge list, 50k-250k of them. Runs of
        strings under 256 bytes are read at once (see _short_strings); a longer one, or all
        after a NUL or after many long ones, one at a time."""
        out: list[str] = []
        long_ones = 0
        while len(out) < n:
            left, found = n - len(out), None
            if long_ones < 64:
                # The first window fits a whole vocabulary of ~16-byte entries; after a long
                # string, a small one, so that many long strings cost little.
                window = 24 * left + 64 if not long_ones else 1 << 16
                found = _short_strings(self.buf, self.pos, self.end, left, window)
                if found is None:  # a NUL inside a string: no separator is safe
                    long_ones = 64
            if found and found[2]:
                joined, self.pos, m = found
                run = self.decode(joined, f"metadata {key}").split(_SEPARATOR)
                del run[0]  # before the first separator: nothing
                if m == n:
                    return run  # the usual case: the whole array in one run
                out += run
                if m == left:
                    break
            long_ones += 1
            # the string that ended the run: 256 bytes or more, or one past the end of the file
            out.append(self.string(f"metadata {key}: string {len(out)}"))
        return out

    # -- tensor table ---------------------------------------------------------------------------
    def tensor_entry(self) -> tuple:
        name = self.name("a tensor name")
        n_dims = self.u32()
        if not 1 <= n_dims <= MAX_DIMS:
            raise corrupt(self.path, f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        self.need(8 * n_dims, f"tensor {name}'s dimensions")
        shape = struct.unpack_from(f"<{n_dims}Q", self.buf, self.pos)
        self.pos += 8 * n_dims
        type_id, offset = self.u32(), self.u64()
        return name, shape, type_id, offset

    def check_tensors(self, entries: list, data_start: int, alignment: int) -> dict[str, TensorInfo]:
        tensors = {}
        for name, shape, type_id, offset in entries:
            where = f"tensor {name}"
            if name in tensors:
                raise corrupt(self.path, f"{where} appears twice")
            known = ggml_type(type_id)
            if known is None:
                raise InfernoError(f"{self.path}: {where} has unknown GGML type id {type_id}; the "
                                   f"file is corrupt, or newer than inferno and the gguf package "
                                   f"(pip install -U gguf)")
            type_name, block, block_bytes = known
            if 0 in shape:
                raise corrupt(self.path, f"{where} has a zero dimension {list(shape)}")
            if shape[0] % block:
                raise corrupt(self.path, f"{where} has rows of {shape[0]} weights, not whole "
                                         f"{block}-weight {type_name} blocks")
            nbytes = math.prod(shape) // block * block_bytes  # Python ints: no overflow
            if offset % alignment:
                raise corrupt(self.path, f"{where}'s offset {offset} is not a multiple of the "
                                         f"alignment {alignment}")
            start = data_start + offset
            if start + nbytes > self.end:
                raise corrupt(self.path, f"{where} ({type_name} {list(shape)}, {nbytes} bytes at "
                                         f"{start}) runs past the end of the file ({self.end} bytes)")
            tensors[name] = TensorInfo(name, type_id, type_name, tuple(shape), start, nbytes)
        ranges = sorted(tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ranges, ranges[1:]):
            if b.offset < a.offset + a.nbytes:
                raise corrupt(self.path, f"tensors {a.name} and {b.name} overlap")
        return tensors


def _short_strings(buf, start: int, end: int, n: int, window: int) -> tuple[np.ndarray, int, int] | None:
    """Up to n length-prefixed strings from `start`, found without a Python loop: guess that
    each is under 256 bytes (its 8-byte length is then below 256), find every position holding
    such a number, and keep the run of guesses that chain (each string ends where the next
    length begins). Returns (bytes, end position, m): the first m strings' bytes with each length
    zeroed, so that 8 NULs separate them. m stops short of n at a string of 256 bytes or more,
    which the caller reads on its own; None when a string holds a NUL (never in a real
    vocabulary), making the separators ambiguous. The window (bytes looked at) doubles until it
    holds the run, so the work is proportional to the array, not to the file."""
    window = min(end - start, window)
    while True:
        if window < 8:
            return b"", start, 0
        b = np.frombuffer(buf, dtype=np.uint8, count=window, offset=start)  # [window]
        zero = b == 0
        small = zero[1:window - 6].copy()  # [window - 7]: b[p + 1 : p + 8] are all zero
        for k in range(2, 8):
            small &= zero[k:window - 7 + k]
        pos = np.flatnonzero(small)[:n]
        if pos.size == 0 or pos[0] != 0:
            return b"", start, 0
        nxt = pos + 8 + b[pos]  # where each string ends
        broken = np.flatnonzero(nxt[:-1] != pos[1:])
        m = int(broken[0]) + 1 if broken.size else pos.size
        if not broken.size and (m < n or nxt[-1] > window) and window < end - start:
            window = min(end - start, 2 * window)
            continue
        if nxt[m - 1] > window:  # the last runs past the file: the caller reports it
            m -= 1
        break
    stop = int(nxt[m - 1]) if m else 0
    data = b[:stop].copy()  # [stop]
    data[pos[:m]] = 0
    return (data, start + stop, m) if np.count_nonzero(data) == stop - 8 * m else None
