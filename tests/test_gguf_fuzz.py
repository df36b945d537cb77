"""Untrusted GGUF files, tried as a hostile user would: thousands of mutated copies of a tiny valid
GGUF (its header, the metadata's counts, lengths, type ids and values, the tensor table's names,
dims, types and offsets, random bytes, insertions, deletions, truncation). Each must load, or
fail with one InfernoError line, within 5 seconds: no other exception, no hang, no crash.

The fields to mutate are found with the gguf package's reader on the valid file, so the
mutations know where every count and length is without trusting the reader under test."""

from __future__ import annotations

import faulthandler
import signal
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_gguf import mixed_types, write_gguf

from inferno.formats.quant import QuantTensor
from inferno.errors import InfernoError
from inferno.loading.loader import open_checkpoint

CASES = 2000
SECONDS_PER_CASE = 5


@pytest.fixture(scope="module")
def seed(llama_dir, tmp_path_factory) -> tuple[bytes, dict[str, list[tuple[int, int]]]]:
    """The valid file's bytes, and where its integer fields are: (offset, size) by kind."""
    import gguf

    path = write_gguf(llama_dir, tmp_path_factory.mktemp("fuzz") / "seed.gguf", types=mixed_types)
    reader = gguf.GGUFReader(path)
    base = reader.data.ctypes.data
    fields: dict[str, list[tuple[int, int]]] = {"header": [], "metadata": [], "values": [], "tensors": []}

    def add(kind, part):
        if part.dtype.kind in "ui" and part.dtype.itemsize >= 4:  # counts, lengths, ids, dims
            at = part.ctypes.data - base
            fields[kind] += [(at + i * part.dtype.itemsize, part.dtype.itemsize) for i in range(part.size)]

    for name, field in reader.fields.items():
        for i, part in enumerate(field.parts):
            # key length, value type, then an array's element type and count or a string's length
            structural = i in (0, 2) or (i in (3, 4) and field.types[0] in (gguf.GGUFValueType.ARRAY,
                                                                          gguf.GGUFValueType.STRING))
            add("header" if name.startswith("GGUF.") else "metadata" if structural else "values", part)
    for t in reader.tensors:
        for part in t.field.parts:
            add("tensors", part)
    return path.read_bytes(), fields


BOUNDARIES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 30, 31, 32, 33, 255, 256, 1023, 2**16, 2**31 - 1,
              2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
FIELD_KINDS = ["header", "metadata", "values", "tensors"]

set_field = st.tuples(st.just("set"), st.sampled_from(FIELD_KINDS), st.integers(0, 10**6),
                      st.one_of(st.sampled_from(BOUNDARIES), st.integers(0, 2**64 - 1)))
nudge_field = st.tuples(st.just("nudge"), st.sampled_from(FIELD_KINDS), st.integers(0, 10**6),
                        st.integers(-300, 300))
# Byte positions are drawn wide and taken modulo the length, so that they spread over the file.
position = st.integers(0, 2**32)
flip_bytes = st.tuples(st.just("bytes"), st.lists(st.tuples(position, st.integers(0, 255)),
                                                  min_size=1, max_size=8))
splice = st.tuples(st.just("splice"), position, st.integers(0, 16), st.binary(max_size=16))
truncate = st.tuples(st.just("truncate"), position)
MUTATIONS = st.lists(st.one_of(set_field, set_field, nudge_field, flip_bytes, splice, truncate),
                     min_size=1, max_size=3)


def mutate(data: bytes, fields: dict, mutations: list) -> bytes:
    """Apply each mutation; byte-level ones land after the magic (a wrong magic is refused first
    thing) in the header, metadata and tensor table (the tensor data is only weights)."""
    out = bytearray(data)
    table_end = max(at + size for spots in fields.values() for at, size in spots)
    for kind, *args in mutations:
        end = min(table_end, len(out)) - 4  # bytes after the magic; splices and cuts move the end
        if kind in ("set", "nudge"):
            field_kind, index, value = args
            at, size = fields[field_kind][index % len(fields[field_kind])]
            if at + size > len(out):
                continue
            if kind == "nudge":
                value += int.from_bytes(out[at:at + size], "little")
            out[at:at + size] = (value % 2 ** (8 * size)).to_bytes(size, "little")
        elif kind == "bytes":
            for where, byte in args[0]:
                if end > 0:
                    out[4 + where % end] = byte
        elif kind == "splice" and end > 0:
            where, n_delete, insert = args
            at = 4 + where % end
            out[at:at + n_delete] = insert
        elif kind == "truncate" and out:
            del out[args[0] % len(out):]
    return bytes(out)


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so that no `except Exception` in the code swallows it."""


def _alarm(signum, frame):
    raise CaseTimeout()


def load_or_fail_cleanly(path) -> str:
    """'loaded' or 'refused'; anything else is an assertion error naming what happened."""
    try:
        checkpoint = open_checkpoint(path)
    except InfernoError as e:
        message = str(e)
        assert len(message.splitlines()) == 1 and message.isprintable(), repr(message)
        return "refused"
    for name, w in checkpoint.tensors.items():
        assert isinstance(w, QuantTensor) or (isinstance(w, np.ndarray) and w.dtype == np.float32), name
    tok = checkpoint.tokenizer  # a vocabulary that loaded must also work
    tok.decode(tok.encode("Hello, world! 123 Café"))
    return "loaded"


def test_mutated_gguf_files_load_or_fail_with_one_inferno_error(seed, tmp_path):
    data, fields = seed
    path = tmp_path / "case.gguf"
    outcomes = Counter()
    previous = signal.signal(signal.SIGALRM, _alarm)

    @settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(MUTATIONS)
    def case(mutations):
        path.write_bytes(mutate(data, fields, mutations))
        # The alarm fails a slow case; the watchdog ends the run if a hang in C code ignores it.
        faulthandler.dump_traceback_later(3 * SECONDS_PER_CASE, exit=True)
        signal.setitimer(signal.ITIMER_REAL, SECONDS_PER_CASE)
        try:
            outcomes[load_or_fail_cleanly(path)] += 1
        except CaseTimeout:
            raise AssertionError(f"no answer within {SECONDS_PER_CASE} s for {mutations}") from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            faulthandler.cancel_dump_traceback_later()

    try:
        case()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert sum(outcomes.values()) >= CASES, outcomes
    # Both outcomes occur: the mutations reach past the first check, and the checks refuse.
    assert outcomes["loaded"] >= CASES // 100 and outcomes["refused"] >= CASES // 2, outcomes
