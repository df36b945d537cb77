"""Embeddings: a prompt's hidden states pooled into one vector, as sentence-transformers and
llama-server's `--embeddings` give them.

A text to embed runs through the generation loop as any prompt does (scheduler.py: its chunks,
a KV cache slot, other requests in the same steps), but asks each step for its rows' hidden
states after the final norm instead of logits (decoder.Segment.hidden), and samples nothing.
A Pooler folds the rows as the chunks come:

  last  the last token's row (Qwen3-Embedding, and any causal model: the one row that has
        seen the whole text)
  mean  the average of every row
  cls   the first row
  none  every row, one vector per token (not an OpenAI shape: the CLI and engine.embed only)

then come a sentence-transformers folder's Dense layers, a Matryoshka truncation if asked for,
and the L2 norm (on by default, as the OpenAI API's vectors are).

Where the pooling comes from: a sentence-transformers folder's modules.json and its Pooling
module's config.json, or a GGUF's `{arch}.pooling_type` (llama.cpp's enum); a flag overrides
both. A model that says nothing (a chat model) embeds with last-token pooling, as vLLM does,
and the engine says so once.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np

from inferno.errors import InfernoError
from inferno.loading.pooling import EmbeddingSpec
from inferno.sampling import SamplingParams
from inferno.sequence import Options, Sequence

POOLINGS = ("last", "mean", "cls", "none")
DEFAULT_POOLING = "last"  # for a model whose files name none
MAX_INPUTS = 2048  # texts in one request, as OpenAI's API allows


def check_lengths(prompts: list[list[int]], limit: int, what: str) -> None:
    """Each text within `limit` tokens (`what`: the limit, as the error names it)."""
    for i, ids in enumerate(prompts):
        if len(ids) > limit:
            raise InfernoError(f"input {i} has {len(ids)} tokens, more than {what}: shorten it", params=("input",))


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise InfernoError(f"unknown pooling {pooling!r}: choose one of {', '.join(POOLINGS)}",
                           params=("pooling",))
    return pooling


# -- pooling, as the rows come -----------------------------------------------------------------
@dataclass
class Pooler:
    """One text's rows folded as its chunks come (`add`), then its vector (`result`). The mean
    adds in float64 one row at a time, in position order, so the sum does not depend on how the
    prompt was cut into chunks."""

    pooling: str
    finish: object  # vector(s) -> vector(s): the Dense layers, truncation and norm (Embedder)
    # A model that attends both ways: every row depends on every other, so the text goes
    # through in one pass from position 0, and no cached prefix stands in for rows.
    whole: bool = False
    _sum: np.ndarray | None = None
    _rows: list = field(default_factory=list)
    _count: int = 0

    def add(self, rows: np.ndarray, start: int) -> None:
        """Hidden rows [n, hidden] of positions start..start + n."""
        rows = np.asarray(rows, np.float32)
        if self.pooling == "mean":
            if self._sum is None:
                self._sum = np.zeros(rows.shape[1], np.float64)
            for row in rows:
                self._sum += row
            self._count += rows.shape[0]
        elif self.pooling == "cls":
            if start == 0:
                self._rows = [rows[0]]
        elif self.pooling == "last":
            self._rows = [rows[-1]]
        else:
            self._rows.append(rows)

    @property
    def reuses_prefix(self) -> bool:
        """Whether a cached prefix may stand in for rows: only where the last row alone is
        pooled, and the rows before it did not see what came after them."""
        return self.pooling == "last" and not self.whole

    def result(self) -> np.ndarray:
        if self.pooling == "mean":
            return self.finish((self._sum / self._count).astype(np.float32))
        if self.pooling == "none":
            return self.finish(np.concatenate(self._rows))
        return self.finish(self._rows[0])


@dataclass(frozen=True)
class Embedder:
    """How one request's texts become vectors: the pooling and what follows it."""

    spec: EmbeddingSpec
    pooling: str
    normalize: bool = True
    dimensions: int | None = None
    whole: bool = False  # the model attends both ways: each text in one pass (Pooler.whole)

    def pooler(self) -> Pooler:
        return Pooler(self.pooling, self.finish, self.whole)

    def finish(self, v: np.ndarray) -> np.ndarray:
        """Dense layers, truncation, norm: of one vector [d], or of each row of [n, d]."""
        for dense in self.spec.dense:
            v = dense(v)
        if self.dimensions is not None:
            v = v[..., :self.dimensions]
        if self.normalize:
            norm = np.linalg.norm(v.astype(np.float64), axis=-1, keepdims=True)
            v = v / np.maximum(norm, 1e-12)
        return np.ascontiguousarray(v, np.float32)


# An embedding samples nothing: its Sequence's options only size its slot (the prompt and one).
_OPTIONS = Options(max_tokens=1, sampling=SamplingParams(temperature=0.0))


def sequences(prompts: list[list[int]], embedder: Embedder, tokenizer, eos, **kwargs) -> list[Sequence]:
    """One Sequence for each prompt to embed, its Pooler on it, for the generation loop;
    `kwargs` as Sequence takes them (owner, arrival)."""
    seqs = [Sequence(ids, _OPTIONS, tokenizer, eos, index=i, **kwargs) for i, ids in enumerate(prompts)]
    for seq in seqs:
        seq.pooler = embedder.pooler()
    return seqs


def encode_base64(v: np.ndarray) -> str:
    """OpenAI's base64 embedding: the float32 values' little-endian bytes."""
    return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
