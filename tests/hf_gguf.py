"""transformers reading a GGUF file (the oracles of the real-model and tokenizer tests), its
header parsed once.

transformers opens a GGUF file with gguf-py's reader at each step of a load: the config, the
tokenizer, the weights. The reader takes the header apart in millions of small slices of an
np.memmap, and each slice of a memmap runs numpy's Python-level memmap hooks: Gemma 3's
262,144-token vocabulary took 8.5 s a parse, 2.6 s over the same bytes as a plain array. Inside
`one_parse()` each file is parsed once, over a plain array: the same parser, the same values."""

from __future__ import annotations

import contextlib

import gguf
import numpy as np
import pytest


class _PlainReader(gguf.GGUFReader):
    """gguf-py's reader over the file's mapping viewed as a plain ndarray."""

    @property
    def data(self):
        return self._plain

    @data.setter
    def data(self, mapped):  # (GGUFReader.__init__ sets it first, to an np.memmap)
        self._plain = mapped.view(np.ndarray)


@contextlib.contextmanager
def one_parse():
    """transformers' GGUF loads inside the block read each file's header once."""
    parsed: dict = {}

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in parsed:
            parsed[key] = _PlainReader(path, *args, **kwargs)
        return parsed[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", reader)
        yield
