"""The GGUF parser (inferno/formats/gguf_file.py): values as the gguf package reads them, vocabularies
read fast and right whatever their strings, and one InfernoError line for each way a file can lie
about itself, raised before anything is allocated."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from tiny_gguf import V, gguf_bytes, gguf_kv, gguf_string, gguf_tensor

from inferno.formats.quant import QTYPES
from inferno.errors import InfernoError
from inferno.formats.quant import GGML_TYPES
from inferno.formats.gguf_file import FILE_TYPES, file_type_name, read_gguf


def write(tmp_path, data: bytes):
    path = tmp_path / "x.gguf"
    path.write_bytes(data)
    return path


def error_of(tmp_path, data: bytes) -> str:
    path = write(tmp_path, data)
    with pytest.raises(InfernoError) as e:
        read_gguf(path)
    message = str(e.value)
    assert str(path) in message and len(message.splitlines()) == 1 and message.isprintable(), message
    return message


def f32(x: float) -> float:
    return float(np.float32(x))


SCALARS = [("u8", V.UINT8, 200), ("i8", V.INT8, -5), ("u16", V.UINT16, 60000), ("i16", V.INT16, -300),
           ("u32", V.UINT32, 4_000_000_000), ("i32", V.INT32, -2_000_000_000), ("f32", V.FLOAT32, 1e-5),
           ("bool", V.BOOL, True), ("u64", V.UINT64, 2**63 + 5), ("i64", V.INT64, -2**62),
           ("f64", V.FLOAT64, 0.1), ("text", V.STRING, "Café 東京 🙂"), ("empty", V.STRING, "")]
ARRAYS = [("ints", V.UINT32, [1, 2, 3]), ("floats", V.FLOAT32, [0.5, 1e-5]), ("bools", V.BOOL, [True, False]),
          ("words", V.STRING, ["Ġthe", "", "東京", "x" * 300, "<|im_end|>"]), ("none", V.UINT8, []),
          ("nested", V.ARRAY, [(V.UINT8, [1, 2]), (V.STRING, ["a", "b"]), (V.INT64, [])])]


def test_metadata_values_are_plain_python_as_the_gguf_package_reads_them(tmp_path):
    kvs = [gguf_kv(k, t, v) for k, t, v in SCALARS] + [gguf_kv(k, V.ARRAY, v, t) for k, t, v in ARRAYS]
    path = write(tmp_path, gguf_bytes(kvs, []))
    got = read_gguf(path).metadata

    want = {k: f32(v) if t == V.FLOAT32 else v for k, t, v in SCALARS}
    want.update({k: [f32(x) for x in v] if t == V.FLOAT32 else v for k, t, v in ARRAYS if t != V.ARRAY})
    want["nested"] = [[1, 2], ["a", "b"], []]
    assert got == want
    assert [type(got[k]) for k in want] == [type(v) for v in want.values()]
    # The gguf package reads the same bytes to the same values (it flattens nested arrays).
    reader = gguf.GGUFReader(path)
    assert {k: got[k] for k in want if k != "nested"} == {
        k: reader.fields[k].contents() for k in want if k != "nested"}


@pytest.mark.parametrize("case", ["short", "long among short", "long first", "long last", "nul inside",
                                  "all empty", "many long"])
def test_string_arrays_read_at_once_or_one_by_one_give_the_same_strings(case, tmp_path):
    """Vocabularies are read by guessing where each length is; every way the guess can fail
    must fall back to the plain walk and give the same list."""
    rng = np.random.default_rng(len(case))
    alphabet = list("abcĠ東🙂 \n") + ["\x00"] * (case == "nul inside")
    words = ["".join(rng.choice(alphabet, size=rng.integers(0, 12))) for _ in range(3000)]
    if case == "long among short":
        words[1000] = "y" * 256
        words[2000] = "東" * 300
    elif case == "long first":
        words[0] = "z" * 1000
    elif case == "long last":
        words[-1] = "z" * 70000  # past the first window, too
    elif case == "all empty":
        words = [""] * 3000
    elif case == "many long":
        words = ["w" * int(n) for n in rng.integers(250, 270, size=500)]
    path = write(tmp_path, gguf_bytes([gguf_kv("tokens", V.ARRAY, words, V.STRING),
                                       gguf_kv("after", V.UINT32, 7)], []))
    meta = read_gguf(path).metadata
    assert meta["tokens"] == words
    assert meta["after"] == 7  # the walk ended exactly where the array ends


def test_type_table_matches_the_gguf_package_and_the_quant_types():
    for type_id, (name, block, block_bytes) in GGML_TYPES.items():
        qtype = gguf.GGMLQuantizationType(type_id)
        assert (qtype.name, *gguf.GGML_QUANT_SIZES[qtype]) == (name, block, block_bytes)
    for q in QTYPES.values():
        assert GGML_TYPES[q.ggml_id] == (q.name, q.block, q.block_bytes)


def test_file_type_table_matches_the_gguf_package():
    for file_type, name in FILE_TYPES.items():
        assert gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_") == name
    assert file_type_name(15) == "Q4_K_M" and file_type_name(38) == "MXFP4_MOE"  # from the package
    assert file_type_name(999) is None


def test_tensor_table(tmp_path):
    data = np.arange(64 * 3, dtype=np.float32).tobytes()  # [3, 64] F32, then [2, 32] Q8_0 blocks
    tensors = [gguf_tensor("a", (64, 3), 0, 0), gguf_tensor("b", (32, 2), 8, 768)]
    path = write(tmp_path, gguf_bytes([gguf_kv("general.alignment", V.UINT32, 256)], tensors,
                                      data + bytes(68), alignment=256))
    gf = read_gguf(path)
    a, b = gf.tensors["a"], gf.tensors["b"]
    assert (a.type_name, a.shape, a.hf_shape, a.nbytes, a.row_bytes) == ("F32", (64, 3), (3, 64), 768, 256)
    assert (b.type_name, b.shape, b.nbytes, b.row_bytes) == ("Q8_0", (32, 2), 68, 34)
    assert a.offset % 256 == 0 and b.offset == a.offset + 768
    np.testing.assert_array_equal(gf.raw(a).view(np.float32), np.arange(64 * 3))


def _array_head(key: str, elem: int, count: int) -> bytes:
    return gguf_string(key) + struct.pack("<IIQ", V.ARRAY, elem, count)


def _nested(depth: int) -> bytes:
    inner = struct.pack("<IQ", V.UINT8, 0)
    for _ in range(depth - 1):
        inner = struct.pack("<IQ", V.ARRAY, 1) + inner
    return gguf_string("deep") + struct.pack("<I", V.ARRAY) + inner


def _table(*entries, data: bytes = bytes(256)) -> bytes:
    return gguf_bytes([], list(entries), data)


HEADER_AND_METADATA = {
    "truncated header": (b"GGUF\x03\x00\x00\x00\x00", "shorter than a GGUF header"),
    "truncated metadata": ((b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_kv("a", V.STRING, "abcdef"))[:-3],
                           "the value of a of 6 bytes runs past the end of the file at byte 45"),
    "version 1": (gguf_bytes([], [], version=1), "GGUF version 1 (2023) is not supported"),
    "corrupt version": (gguf_bytes([], [], version=0xFFFFFFFF), "GGUF version 4294967295; inferno reads"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "a big-endian GGUF file"),
    "huge key-value count": (gguf_bytes([], [], n_kv=2**63), "key-value count 9223372036854775808 needs"),
    "huge tensor count": (gguf_bytes([], [], n_tensors=2**40), "tensor count 1099511627776 needs"),
    "huge array count": (gguf_bytes([_array_head("a", V.UINT32, 2**62)], []), "array length 4611686018427387904"),
    "huge string array": (gguf_bytes([_array_head("a", V.STRING, 10**12)], []), "array length 1000000000000"),
    "huge string length": (gguf_bytes([gguf_string("k") + struct.pack("<IQ", V.STRING, 2**63)], []),
                           "the value of k of 9223372036854775808 bytes runs past the end"),
    "huge key length": (gguf_bytes([struct.pack("<Q", 2**64 - 1) + bytes(16)], []),
                        "a metadata key of 18446744073709551615 bytes runs past"),
    "unknown value type": (gguf_bytes([gguf_string("k") + struct.pack("<I", 99)], []), "k has unknown value type 99"),
    "array of unknown type": (gguf_bytes([_array_head("a", 42, 1)], []), "an array of unknown value type 42"),
    "arrays nested too deep": (gguf_bytes([_nested(20)], []), "nests arrays 9 deep"),
    "duplicate key": (gguf_bytes([gguf_kv("k", V.UINT8, 1)] * 2, []), "metadata key k appears twice"),
    "key not UTF-8": (gguf_bytes([gguf_kv(b"\xff\xfe", V.UINT8, 1)], []), "a metadata key is not valid UTF-8"),
    "key not printable": (gguf_bytes([gguf_kv("a\nb", V.UINT8, 1)], []), "a metadata key 'a\\nb' is not a name"),
    "value not UTF-8": (gguf_bytes([gguf_kv("k", V.STRING, b"\xc3")], []), "the value of k is not valid UTF-8"),
    "vocabulary not UTF-8": (gguf_bytes([gguf_kv("t", V.ARRAY, [b"a", b"\xe6\x9d"], V.STRING)], []),
                             "metadata t is not valid UTF-8"),
    "alignment not a power of two": (gguf_bytes([gguf_kv("general.alignment", V.UINT32, 24)], []),
                                     "general.alignment is 24, not a power of two"),
    "alignment not a number": (gguf_bytes([gguf_kv("general.alignment", V.STRING, "32")], []),
                               "general.alignment is '32', not a power of two"),
}
TENSOR_TABLE = {
    "unknown type id": (_table(gguf_tensor("w", (8, 2), 99, 0)), "tensor w has unknown GGML type id 99"),
    "no dimensions": (_table(gguf_tensor("w", (), 0, 0)), "tensor w has 0 dimensions (1 to 4 allowed)"),
    "five dimensions": (_table(gguf_tensor("w", (1, 1, 1, 1, 1), 0, 0)), "tensor w has 5 dimensions"),
    "zero dimension": (_table(gguf_tensor("w", (8, 0), 0, 0)), "tensor w has a zero dimension [8, 0]"),
    "rows not whole blocks": (_table(gguf_tensor("w", (33, 1), 8, 0)),
                              "rows of 33 weights, not whole 32-weight Q8_0 blocks"),
    "misaligned offset": (_table(gguf_tensor("w", (8, 2), 0, 4)), "offset 4 is not a multiple of the alignment 32"),
    "offset out of file": (_table(gguf_tensor("w", (8, 2), 0, 2**40)), "runs past the end of the file"),
    "size out of file": (_table(gguf_tensor("w", (2**32, 2**32), 0, 0)),
                         "F32 [4294967296, 4294967296], 73786976294838206464 bytes"),
    "truncated data": (_table(gguf_tensor("w", (64, 2), 0, 0), data=bytes(500)), "runs past the end of the file"),
    "overlapping tensors": (_table(gguf_tensor("a", (8, 2), 0, 0), gguf_tensor("b", (8, 2), 0, 32)),
                            "tensors a and b overlap"),
    "duplicate names": (_table(gguf_tensor("a", (8, 1), 0, 0), gguf_tensor("a", (8, 1), 0, 64)),
                        "tensor a appears twice"),
    "name not printable": (_table(gguf_tensor("w\r", (8, 1), 0, 0)), "a tensor name 'w\\r' is not a name"),
    "name too long": (_table(gguf_tensor("w" * 300, (8, 1), 0, 0)), "longer than 256 characters"),
}


@pytest.mark.parametrize("case", list(HEADER_AND_METADATA) + list(TENSOR_TABLE))
def test_each_lie_in_a_file_is_one_line(case, tmp_path):
    data, expected = {**HEADER_AND_METADATA, **TENSOR_TABLE}[case]
    message = error_of(tmp_path, data)
    assert expected in message, message
    if case not in ("version 1", "big-endian", "unknown type id"):
        assert "truncated or corrupt GGUF file" in message and "download it again" in message


def test_a_valid_table_of_two_tensors_reads(tmp_path):
    """The control for the table cases: the same builder, nothing wrong."""
    gf = read_gguf(write(tmp_path, _table(gguf_tensor("a", (8, 2), 0, 0), gguf_tensor("b", (8, 2), 0, 64))))
    assert list(gf.tensors) == ["a", "b"]
