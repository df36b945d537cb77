"""The Backend contract, with a correct vectorised-numpy default for every op.

A backend owns its tensor type and decides how each operation runs. The model
(model/decoder.py) calls nothing but these methods, which is what lets a backend swap an algorithm and lets the
tracing backend count every call. Tensors are 2-D `[rows, features]` unless said otherwise;
weights keep the Hugging Face `[out, in]` layout.

The defaults here operate on float32 numpy arrays: the `cpu` backend is this class, its every op
unchanged (it only skips a load's warm-up, which has nothing to do for it).
A backend with another tensor type (torch) overrides every op.
"""

from __future__ import annotations

import math
import resource
import sys

import contextlib
from dataclasses import dataclass, field

import numpy as np

from inferno.formats import cache_types
from inferno.formats.quant import QuantTensor

# Keys per streamed K/V tile (and query rows per block) in the flash defaults.
TILE = 64

# Weights per dequantised tile in the reference's quantized linear (16 MiB of float32).
QUANT_TILE = 1 << 22

# Every operation the model calls: the contract; the tracing backend times exactly these.
OPS = (
    "embedding", "linear", "linear_many", "rms_norm", "rope_tables", "apply_rope",
    "silu_mul", "gelu_mul", "add", "scale", "rows", "take_rows", "write_rows",
    "write_kv", "write_kv_rows", "read_kv", "copy_kv", "flash_attention_prefill", "materialized_attention",
    "decode_attention", "moe",
)
# What the materialized reference (`materialized_attention`, the seed's textbook path and the
# one flash is compared with) is built of. The model never calls them: they are not the
# contract, but a backend may make them fast for its `--flash off` (pool and torch do).
MATERIALIZED_PARTS = ("matmul", "softmax_rows", "transpose_2d", "fill_strict_upper_tri",
                      "copy_2d_from_cols", "copy_2d_into_cols")

# KV cache element types (`--cache-type`): what one layer's K or V buffer stores.
CACHE_TYPES = tuple(cache_types.DTYPES)  # ("f32", "f16", "bf16", "q8_0")


@dataclass
class SlotStart:
    """A sequence whose sampling state a device must (re)build before its row samples there:
    the first time it decodes on the device, or after steps sampled on the host."""

    row: int
    seen: np.ndarray  # int64: the prompt and every sampled token but the last (repetition penalty)
    generated: np.ndarray  # int64: the reply's tokens but the last (presence, frequency)
    bias: tuple[tuple[int, float], ...]  # (token id, added to its logit)


@dataclass
class DecodeRows:
    """One decode step of B sequences, as the host hands it to a device runner
    (Backend.decode_graphs): per row, the token fed and where it goes, and how to sample the
    next. Arrays are [B]; each sequence's last token (`ids`) counts as generated and seen from
    this step on."""

    ids: np.ndarray  # int64: each sequence's last sampled token, fed now
    positions: np.ndarray  # int64: its position in the slot (the slot's length before the step)
    slots: np.ndarray  # int64: each sequence's KV cache slot
    temperature: np.ndarray  # the sampling settings, as inferno.sampling.SamplingParams has them
    top_k: np.ndarray
    top_p: np.ndarray
    min_p: np.ndarray
    repeat: np.ndarray  # the repetition penalty (1: off)
    presence: np.ndarray  # OpenAI's penalties (0: off)
    frequency: np.ndarray
    draws: np.ndarray  # float64: the uniform number each row's draw uses (its generator's; 0 when greedy)
    masks: np.ndarray | None = None  # [B, words] int32 grammar masks (constrain.py), None: none
    constrained: np.ndarray | None = None  # bool: which rows the masks apply to
    logprobs: int = -1  # alternatives wanted with each row's log-probability; -1: none at all
    starts: list[SlotStart] = field(default_factory=list)


class Backend:
    """Reference implementations of every op, on float32 numpy arrays."""

    name = "base"
    device = "cpu"
    default_cache_type = "f32"  # what kv_buffer stores when not told (see CACHE_TYPES)
    device_step = False  # whether decode_graphs gives a runner: decode steps sampled on the device
    # Whether a load's warm-up saves a reply work (Engine._load_warm_up): kernels to compile,
    # libraries or device state that load on first use. The numpy reference (cpu.py) has none:
    # its warm-up was a dozen steps of arithmetic, seconds for a real model.
    warms_up = True
    # Whether the model sends every row of a cached step through decode_attention (with flash
    # attention on, the default), a prefill's rows as a decode's, because this backend's decode attention is the same sum for a row
    # whatever rows share its step. With products that compute a row alike for one row or many
    # (simd and pool: the legacy kinds taken as int16; not yet the K-quants or float weights), a
    # prompt's logits then do not depend on how it was cut into chunks, how much of it a cache
    # already held, or which requests it was batched with.
    batch_invariant = False

    # -- tensors at the edges ------------------------------------------------------------------
    def from_numpy(self, a: np.ndarray):
        """A float32 host array as this backend's tensor (for weights and activations)."""
        return np.ascontiguousarray(a, dtype=np.float32)

    def weight(self, w):
        """A `[out, in]` linear or embedding weight, float32 or a QuantTensor, stored as this
        backend multiplies it fastest. Here: kept as given (a read-only memory-mapped view stays
        one, a QuantTensor stays quantized)."""
        return w if isinstance(w, QuantTensor) else self.from_numpy(w)

    def quantize_weight(self, w: np.ndarray, qtype: str) -> QuantTensor:
        """float32 rows `w` [rows, cols] in a GGML block type ("q8_0" or "q4_0"; cols a multiple
        of 32), as llama.cpp's quantizer writes them (`--weights`). Here: the gguf package's
        reference quantizer."""
        from gguf import GGMLQuantizationType, quants

        kind = GGMLQuantizationType[qtype.upper()]
        data = quants.quantize(np.ascontiguousarray(w, dtype=np.float32), kind)
        return QuantTensor(qtype.upper(), w.shape, data)

    def linear_weight(self, w):
        """A `[out, in]` weight that only `linear`/`linear_many` will multiply (never looked up
        as an embedding, never an expert's stack): weight(w), or a form made for this backend's
        products alone. Here: weight(w)."""
        return self.weight(w)

    def experts_weight(self, w, n_expert: int):
        """A mixture's stacked matrix of one kind (`[n_expert * out, in]`, expert e's rows
        e * out .. (e + 1) * out) that only `moe` will multiply: weight(w), or a form made for
        this backend's expert products alone. Here: weight(w)."""
        return self.weight(w)

    def weight_nbytes(self, w) -> int:
        """Bytes of `w` (as weight() returned it) that one decode step reads."""
        return w.nbytes

    def to_numpy(self, x) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    def zeros(self, rows: int, cols: int):
        return np.zeros((rows, cols), dtype=np.float32)

    def indices(self, values):
        """Host integers (token ids, positions, cache slots, lengths) as this backend's index
        tensor [n]. The device-resident decode step (DecoderModel.decode) hands such tensors to
        embedding, take_rows, write_kv_rows and decode_attention, which read them where they
        lie: on a GPU backend no host round trip, so the step can be captured and replayed.
        Here: an int64 array."""
        return np.asarray(values, dtype=np.int64)

    def decode_graphs(self, step, n_slots: int, capacity: int, vocab: int, max_batch: int):
        """A runner of the decode step on the device, or None: this backend decodes op by op
        and the host samples. `step(ids, positions, slots, kv_lens)` is the model's
        device-resident step (DecoderModel.decode on one cache of n_slots x capacity positions,
        index tensors in, logits out); the runner adds sampling and, on CUDA, captures both for each batch size up to
        `max_batch`. Its `run(DecodeRows)` returns the sampled token ids [B] and, when asked,
        each row's log-probabilities. Here: None."""
        return None

    def kv_buffer(self, slots: int, capacity: int, width: int, cache_type: str | None = None):
        """One layer's K or V cache: `slots` sequences of `capacity` positions x `width`
        (n_kv_heads * head_dim) features, stored as `cache_type` (see CACHE_TYPES; None: this
        backend's default_cache_type). Written with write_kv, read with read_kv and
        decode_attention; never touched directly by the model. Here a numpy array whose dtype
        names the type (cache_types.py)."""
        return cache_types.empty(slots, capacity, width, cache_type or self.default_cache_type)

    @contextlib.contextmanager
    def every_path(self):
        """Within it, ops take the paths that bigger work would (pool: its parallel kernels,
        whatever the size), so that a short warm-up compiles or loads them all."""
        yield

    def loaded(self, seconds: float) -> None:
        """Called once the engine's load and warm-up are done, after `seconds`: a backend that
        compiles its kernels records how long a compile took here. Not an op."""

    def begin_step(self) -> None:
        """Called before each forward step: a backend may adapt to the machine here (pool sizes
        its thread team to the free cores). Not an op: nothing to compute."""

    def synchronize(self) -> None:
        """Wait for queued device work (timing points call this); CPU backends are synchronous."""

    def peak_memory_bytes(self) -> int:
        """Peak memory of the run: the process's peak resident set on CPU backends."""
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB

    def close(self) -> None:
        """Release threads or device memory; the backend is unusable afterwards."""

    # -- dense ops ------------------------------------------------------------------------------
    def embedding(self, table, ids: np.ndarray):
        """Rows of `table` [vocab, hidden] for token `ids` -> [len(ids), hidden]."""
        ids = np.asarray(ids, dtype=np.int64)
        if isinstance(table, QuantTensor):
            return table.take_rows(ids).dequantize()  # just the rows asked for
        return table[ids]

    def linear(self, x, w):
        """x [rows, in] @ w.T for w [out, in] -> [rows, out]; a matvec when rows == 1. A
        QuantTensor is dequantised QUANT_TILE weights at a time, so memory stays bounded."""
        if not isinstance(w, QuantTensor):
            return x @ w.T
        out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)  # [rows of x, out]
        for r0, r1, tile in self._tiles(w):
            out[:, r0:r1] = x @ tile.T
        return out

    # Bytes of dequantised tiles a backend keeps for its next calls: gguf-py's dequantisation is
    # most of a decode step here, so a real model's weights, where they fit, are dequantised once
    # rather than at every step (the same tiles, so the same products). Past it, made and dropped.
    KEEP_DEQUANTISED = 1 << 30

    def _tiles(self, w: QuantTensor):
        """(r0, r1, w's rows r0:r1 dequantised) for the tiles of QUANT_TILE weights, in order."""
        kept = self.__dict__.setdefault("_dequantised", {})  # id(w) -> (w, its tiles)
        if id(w) in kept:
            return kept[id(w)][1]
        rows, cols = w.shape
        step = max(1, QUANT_TILE // cols)
        bounds = [(r0, min(r0 + step, rows)) for r0 in range(0, rows, step)]
        tiles = ((r0, r1, w.dequantize(r0, r1)) for r0, r1 in bounds)
        used = self.__dict__.get("_dequantised_bytes", 0) + 4 * rows * cols  # (float32 tiles)
        if used > self.KEEP_DEQUANTISED:
            return tiles
        self._dequantised_bytes = used
        kept[id(w)] = (w, list(tiles))  # (w kept alive with them: its id stays its own)
        return kept[id(w)][1]

    def linear_many(self, x, ws):
        """[linear(x, w) for w in ws]: several weights applied to one input (q/k/v, gate/up), which
        a backend may run as one launch."""
        return [self.linear(x, w) for w in ws]

    def rms_norm(self, x, w, eps: float):
        """RMSNorm over each group of len(w) features: the whole row for a layer norm, each
        head for Qwen3's q_norm/k_norm (x [rows, n * len(w)])."""
        rows, width = x.shape
        g = x.reshape(rows, width // w.shape[0], w.shape[0])
        inv = 1.0 / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + eps)
        return (g * inv * w).reshape(rows, width).astype(np.float32, copy=False)

    def rope_tables(self, positions: np.ndarray, inv_freq: np.ndarray):
        """cos and sin of position x frequency, each [len(positions), head_dim // 2]. Computed in
        float64 then rounded, so long positions keep their precision."""
        angles = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def apply_rope(self, x, cos, sin, head_dim: int):
        """Rotate-half RoPE on every head of x [rows, n * head_dim]: the first and second half
        of each head are the real and imaginary parts (the Hugging Face layout)."""
        rows, width = x.shape
        h = x.reshape(rows, width // head_dim, 2, head_dim // 2)
        x1, x2 = h[:, :, 0], h[:, :, 1]  # [rows, n, head_dim // 2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = np.empty_like(h)
        out[:, :, 0] = x1 * c - x2 * s
        out[:, :, 1] = x2 * c + x1 * s
        return out.reshape(rows, width)

    def silu_mul(self, gate, up):
        """SwiGLU: silu(gate) * up. Below gate = -88 exp(-gate) is inf in float32 and the
        quotient the -0.0 silu tends to: right, and no cause for a warning."""
        with np.errstate(over="ignore"):
            return gate / (1.0 + np.exp(-gate)) * up

    def gelu_mul(self, gate, up):
        """GeGLU with the tanh approximation (Gemma's gelu_pytorch_tanh): gelu(gate) * up."""
        g = gate.astype(np.float32, copy=False)
        inner = np.float32(math.sqrt(2.0 / math.pi)) * (g + np.float32(0.044715) * g * g * g)
        return (np.float32(0.5) * g * (np.float32(1.0) + np.tanh(inner)) * up).astype(np.float32, copy=False)

    def add(self, a, b):
        """a + b; b may be a [features] vector added to every row (a bias)."""
        return a + b

    def scale(self, x, s: float):
        return x * np.float32(s)

    def rows(self, x, start: int, stop: int):
        """Rows start..stop of x (a view where the backend can)."""
        return x[start:stop]

    def take_rows(self, x, rows):
        """x[rows] for an index array or index tensor (indices): the rows a step wants logits
        for, a RoPE table's rows for a step's positions."""
        return x[np.asarray(rows, dtype=np.int64)]

    def write_rows(self, dst, src, start: int):
        """dst[start:start + len(src)] = src, in place (a batch's attention rows assembled)."""
        dst[start:start + src.shape[0]] = src

    def moe(self, x, router, experts, top_k: int, norm_topk: bool, biases=None, clamp=None):
        """A mixture-of-experts SwiGLU MLP over x [rows, hidden]. `router` [n_expert, hidden] scores
        the experts; each row takes the top_k by softmax over all of them (renormalised over the
        chosen with `norm_topk`), and its output is the sum, in the order of that ranking, of each
        chosen expert's down(silu(gate x) * up x) times its weight. `experts` is (gate, up, down),
        each expert's matrix stacked by rows: [n_expert * inter, hidden] twice and
        [n_expert * hidden, inter]; expert e is rows e * out .. (e + 1) * out of each.

        gpt-oss adds `biases`, this backend's tensors (router [1, n_expert], gate and up
        [n_expert, inter], down [n_expert, hidden]: expert e's is row e), each added to its
        matrix's product, and `clamp` (alpha, limit), its clamped SwiGLU in place of silu
        (clamped_swiglu).

        Here, through this backend's own ops: the rows are grouped by expert, so each chosen
        expert's weights are read once for all the rows that chose it (expert_rows: views, no
        copy), and the routing runs on the host."""
        gate, up, down = experts
        rb, gb, ub, db = biases if biases is not None else (None,) * 4
        logits = self.linear(x, router)
        plan = ExpertPlan.route(self.to_numpy(logits if rb is None else self.add(logits, rb)), top_k, norm_topk)
        inter, hidden = check_experts(plan.n_experts, gate, up, down)
        xs = self.take_rows(x, plan.tokens)  # [rows * top_k, hidden], grouped by expert
        ys = []
        for e, a, b in plan.groups():
            h = self.rows(xs, a, b)
            g, u = self.linear_many(h, [expert_rows(gate, e, inter), expert_rows(up, e, inter)])
            if gb is not None:
                g, u = self.add(g, self.rows(gb, e, e + 1)), self.add(u, self.rows(ub, e, e + 1))
            act = self.silu_mul(g, u) if clamp is None else self.from_numpy(
                clamped_swiglu(self.to_numpy(g), self.to_numpy(u), *clamp))
            y = self.linear(act, expert_rows(down, e, hidden))
            ys.append(self.to_numpy(y if db is None else self.add(y, self.rows(db, e, e + 1))))
        return self.from_numpy(plan.combine(np.concatenate(ys)))

    # -- the KV cache ---------------------------------------------------------------------------
    def write_kv(self, buf, slot: int, start: int, rows) -> None:
        """buf[slot, start:start + len(rows)] = rows (float32 [n, width]), converted to the
        buffer's cache type, in place."""
        buf[slot, start:start + rows.shape[0]] = cache_types.encode(rows, cache_types.cache_type_of(buf))

    def write_kv_rows(self, buf, slots, positions, rows) -> None:
        """Row i of rows (float32 [n, width]) into buf[slots[i], positions[i]]: a batched decode
        step's new K or V, one row per sequence, in one call rather than one per sequence.
        slots and positions are host integers or index tensors (indices)."""
        for i in range(rows.shape[0]):
            self.write_kv(buf, int(slots[i]), int(positions[i]), rows[i:i + 1])

    def read_kv(self, buf, slot: int, start: int, stop: int):
        """Positions start..stop of one slot as float32 [stop - start, width] (a chunk's prefill
        after a cache reads the cached rows through this)."""
        return cache_types.decode(buf[slot, start:stop])

    def copy_kv(self, dst, dst_slot: int, src, src_slot: int, start: int, stop: int) -> None:
        """dst[dst_slot, start:stop] = src[src_slot, start:stop], elements as stored (no
        conversion: a copied prefix is the same rows bit for bit). dst and src are buffers of
        one cache type and width; they may be the same buffer (another slot's prefix)."""
        if stop > start:
            dst[dst_slot, start:stop] = src[src_slot, start:stop]

    # -- attention ------------------------------------------------------------------------------
    def flash_attention_prefill(self, q, k, v, n_heads: int, n_kv_heads: int, head_dim: int,
                                causal: bool, window: int = 0, scale: float | None = None,
                                sinks=None):
        """softmax(scale * q k^T) v per head, streaming K/V in tiles of TILE keys with an online
        softmax: never more than one tile of scores per query row.

        q [seq_q, n_heads * head_dim]; k, v [seq_k, n_kv_heads * head_dim]; query head h reads KV
        head h // (n_heads // n_kv_heads). With `causal` the diagonal is bottom-right aligned:
        query row i sits at position p = (seq_k - seq_q) + i and sees keys 0..p, so a chunk
        after a cache works unchanged. A sliding `window` (0: none) keeps the window newest of
        those, keys p - window < j <= p, as transformers and llama.cpp do; without `causal`
        (a model that attends both ways: EmbeddingGemma) it keeps keys on either side,
        |p - j| < window, as transformers' bidirectional Gemma 3 does.
        `scale` defaults to 1 / sqrt(head_dim).

        `sinks` (gpt-oss's attention sinks: this backend's tensor of n_heads float32 logits, or
        None) adds one column per head to every row's softmax, then drops it: head h's weights
        are exp(s_j) / (sum_j exp(s_j) + exp(sinks[h])), so a row's weights sum to less than one.
        A sink is a logit as it stands (no `scale`); -inf is no sink.
        """
        return online_softmax_attention(q, k, v, n_heads, n_kv_heads, head_dim, causal, window, scale,
                                        sinks=sink_logits(self, sinks))

    def decode_attention(self, q, k_buf, v_buf, slots, kv_lens, n_heads: int, n_kv_heads: int,
                         head_dim: int, window: int = 0, scale: float | None = None, sinks=None):
        """One decode step for a batch of sequences, each against its own cache slot.

        q [B, n_heads * head_dim]: row b is the newest token of the sequence in cache slot
        slots[b]; its K/V are already written at position kv_lens[b] - 1, so it attends to that
        slot's keys max(0, kv_lens[b] - window) .. kv_lens[b] - 1 (window 0: all of them).
        `scale` multiplies the scores (None: 1/sqrt(head_dim)); `sinks` join each head's softmax
        as flash_attention_prefill says. The cache is read in place.
        slots and kv_lens are host integers or index tensors (indices); a backend reads the
        latter without a host round trip and checks only what it can see without one.
        Returns [B, n_heads * head_dim] float32."""
        check_decode(q, k_buf, v_buf, slots, kv_lens, n_heads, n_kv_heads, head_dim, window)
        out = np.empty((q.shape[0], n_heads * head_dim), dtype=np.float32)
        sinks = sink_logits(self, sinks)
        for b, (slot, kv_len) in enumerate(zip(slots, kv_lens)):
            start = max(0, kv_len - window) if window else 0
            k = self.read_kv(k_buf, int(slot), start, int(kv_len))  # [kv_len - start, width]
            v = self.read_kv(v_buf, int(slot), start, int(kv_len))
            out[b:b + 1] = online_softmax_attention(q[b:b + 1], k, v, n_heads, n_kv_heads,
                                                    head_dim, True, scale=scale, sinks=sinks)
        return out

    # -- the materialized reference's parts (MATERIALIZED_PARTS) -----------------------------
    def matmul(self, a, b):
        """a [m, k] @ b [k, n] -> [m, n]."""
        return a @ b

    def softmax_rows(self, x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def transpose_2d(self, x):
        return np.ascontiguousarray(x.T)

    def fill_strict_upper_tri(self, x, value: float, offset: int = 0):
        """Copy of x with every element above diagonal `offset` (col > row + offset) set."""
        rows, cols = x.shape
        above = np.arange(cols)[None, :] > np.arange(rows)[:, None] + offset
        return np.where(above, np.float32(value), x)

    def copy_2d_from_cols(self, x, width: int, col: int):
        """Contiguous copy of columns col..col+width."""
        return np.ascontiguousarray(x[:, col:col + width])

    def copy_2d_into_cols(self, dst, src, col: int):
        """Write src into dst's columns col..col+src.cols, in place; returns dst."""
        dst[:, col:col + src.shape[1]] = src
        return dst

    def materialized_attention(self, q, k, v, n_heads: int, n_kv_heads: int, head_dim: int,
                               causal: bool, window: int = 0, scale: float | None = None,
                               sinks=None):
        """The textbook path, per head: scores = q k^T, scale, mask, softmax, @ v, all through
        this backend's own ops. The reference flash is pinned to; `--flash off` runs it.
        A head's sink is one more column of its scores, softmaxed with them and dropped."""
        check_window(causal, window)
        sinks = sink_logits(self, sinks)
        seq_q, seq_k = q.shape[0], k.shape[0]
        offset = seq_k - seq_q  # query row r sits at position offset + r
        group = n_heads // n_kv_heads
        out = self.zeros(seq_q, n_heads * head_dim)
        for h in range(n_heads):
            kv_col = (h // group) * head_dim
            q_h = self.copy_2d_from_cols(q, head_dim, h * head_dim)  # [seq_q, head_dim]
            k_h = self.copy_2d_from_cols(k, head_dim, kv_col)  # [seq_k, head_dim]
            v_h = self.copy_2d_from_cols(v, head_dim, kv_col)  # [seq_k, head_dim]
            scores = self.matmul(q_h, self.transpose_2d(k_h))  # [seq_q, seq_k]
            scores = self.scale(scores, score_scale(head_dim, scale))
            if causal:
                scores = self.fill_strict_upper_tri(scores, -math.inf, offset=offset)
            elif window:  # both ways: key j is too new for row r iff j > r + offset + window - 1
                scores = self.fill_strict_upper_tri(scores, -math.inf, offset=offset + window - 1)
            if window:
                # Keys older than the window are the strict upper triangle of the transposed
                # scores: key j is too old for row r iff r > j + (window - offset - 1).
                old = self.fill_strict_upper_tri(self.transpose_2d(scores), -math.inf,
                                                 offset=window - offset - 1)  # [seq_k, seq_q]
                scores = self.transpose_2d(old)
            if sinks is None:
                p = self.softmax_rows(scores)
            else:  # [scores | sink], softmaxed, the sink's column dropped
                wide = self.copy_2d_into_cols(self.zeros(seq_q, seq_k + 1), scores, 0)
                column = self.from_numpy(np.full((seq_q, 1), sinks[h], np.float32))
                p = self.copy_2d_from_cols(self.softmax_rows(self.copy_2d_into_cols(wide, column, seq_k)),
                                           seq_k, 0)
            ctx = self.matmul(p, v_h)  # [seq_q, head_dim]
            out = self.copy_2d_into_cols(out, ctx, h * head_dim)
        return out


class ExpertPlan:
    """Which experts each row of a step takes, and the step's rows grouped by expert.

    Assignment a = r * top_k + j is row r's j-th choice. Sorted by expert (then by row), the
    assignments make one contiguous group per chosen expert, so each expert's weights are read
    once a step however many rows chose it; `tokens` are the rows to gather in that order.
    Every row is routed and combined on its own, so its output does not depend on the rows
    beside it (the batch-invariance of the dense path)."""

    def __init__(self, weights: np.ndarray, chosen: np.ndarray, n_experts: int):
        self.weights = weights  # [rows, top_k] float32: each choice's weight
        self.chosen = chosen  # [rows, top_k] int64: the experts, best first
        self.n_experts = n_experts
        rows, top_k = chosen.shape
        self.order = np.argsort(chosen.reshape(-1), kind="stable")  # group position -> assignment
        self.tokens = self.order // top_k  # group position -> row of x
        self.position = np.empty_like(self.order)  # assignment -> group position
        self.position[self.order] = np.arange(self.order.size)
        self.position = self.position.reshape(rows, top_k)
        counts = np.bincount(chosen.reshape(-1), minlength=n_experts)
        self.experts = np.flatnonzero(counts).astype(np.int64)  # the experts chosen at all
        self.starts = np.concatenate([[0], np.cumsum(counts[self.experts])]).astype(np.int64)

    @classmethod
    def of(cls, n_experts: int, weights, chosen, order, position, experts, starts) -> "ExpertPlan":
        """A plan from the arrays __init__ makes, computed elsewhere (a fast backend's routing)."""
        plan = cls.__new__(cls)
        plan.weights, plan.chosen, plan.n_experts = weights, chosen, n_experts
        plan.order, plan.tokens, plan.position = order, order // chosen.shape[1], position
        plan.experts, plan.starts = experts, starts
        return plan

    @classmethod
    def route(cls, logits: np.ndarray, top_k: int, norm_topk: bool) -> "ExpertPlan":
        """Route rows by their router logits [rows, n_experts]: softmax in float32 over every
        expert, the top_k largest (the lower expert first on a tie), renormalised if asked."""
        logits = np.asarray(logits, dtype=np.float32)
        n_experts = logits.shape[1]
        check_top_k(top_k, n_experts)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        chosen = np.argsort(-p, axis=1, kind="stable")[:, :top_k]  # [rows, top_k]
        weights = np.take_along_axis(p, chosen, axis=1)
        if norm_topk:
            weights = weights / weights.sum(axis=1, keepdims=True)
        return cls(weights.astype(np.float32), chosen.astype(np.int64), n_experts)

    def groups(self):
        """(expert, first, end) of each chosen expert's run of group positions."""
        for g, e in enumerate(self.experts):
            yield int(e), int(self.starts[g]), int(self.starts[g + 1])

    def combine(self, y: np.ndarray) -> np.ndarray:
        """The rows' outputs from the experts' y [rows * top_k, hidden] (group order): each row's
        choices weighted and added in rank order, one row at a time."""
        top_k = self.chosen.shape[1]
        out = self.weights[:, :1] * y[self.position[:, 0]]  # [rows, hidden]
        for j in range(1, top_k):
            out += self.weights[:, j:j + 1] * y[self.position[:, j]]
        return out


def clamped_swiglu(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's expert activation, float32: (up + 1) * g * sigmoid(alpha * g), where g is the
    gate clamped to at most `limit` and up is clamped to +-limit (transformers' GptOssExperts)."""
    g = np.minimum(gate, np.float32(limit))
    u = np.clip(up, np.float32(-limit), np.float32(limit))
    with np.errstate(over="ignore"):  # a very negative gate: exp overflows to inf, g / inf = 0
        sig = g / (np.float32(1) + np.exp(-np.float32(alpha) * g))
    return ((u + np.float32(1)) * sig).astype(np.float32)


def check_top_k(top_k: int, n_experts: int) -> None:
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be between 1 and the {n_experts} experts, got {top_k}")


def expert_rows(w, e: int, n: int):
    """Expert e's n rows of a stacked expert matrix: a view (a QuantTensor's rows, or a slice)."""
    return w.rows(e * n, (e + 1) * n) if isinstance(w, QuantTensor) else w[e * n:(e + 1) * n]


def check_experts(n_experts: int, gate, up, down) -> tuple[int, int]:
    """(inter, hidden) of stacked experts that fit a router of n_experts, or a ValueError."""
    inter, hidden = gate.shape[0] // n_experts, down.shape[0] // n_experts
    if (gate.shape[0] % n_experts or tuple(up.shape) != tuple(gate.shape)
            or tuple(down.shape) != (n_experts * hidden, inter) or gate.shape[1] != hidden):
        raise ValueError(f"experts of shapes {list(gate.shape)}, {list(up.shape)}, "
                         f"{list(down.shape)} are not {n_experts} stacked SwiGLU experts")
    return inter, hidden


def score_scale(head_dim: int, scale: float | None) -> float:
    """What multiplies q k^T: 1 / sqrt(head_dim) unless the model says otherwise (Gemma 3:
    query_pre_attn_scalar ** -0.5)."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def check_window(causal: bool, window: int) -> None:
    if window < 0:
        raise ValueError(f"window must be 0 (none) or a number of keys, got {window}")


def check_prefill(causal: bool, window: int, seq_q: int, seq_k: int) -> None:
    """A prefill's attention arguments: a window as check_window says, and (bottom-right causal)
    at least as many keys as queries."""
    if causal and seq_k < seq_q:
        raise ValueError(f"causal attention needs at least as many keys ({seq_k}) as queries ({seq_q})")
    check_window(causal, window)


def check_decode(q, k_buf, v_buf, slots, kv_lens, n_heads: int, n_kv_heads: int, head_dim: int,
                 window: int) -> None:
    """decode_attention's arguments: heads that fit q, K and V buffers alike, one slot and one
    length per query row, each length within 1 .. the buffer's capacity."""
    check_window(True, window)
    if n_heads % n_kv_heads or q.shape[1] != n_heads * head_dim:
        raise ValueError(f"q [{q.shape[0]}, {q.shape[1]}] does not hold {n_heads} heads of "
                         f"{head_dim} over {n_kv_heads} KV heads")
    if k_buf.shape != v_buf.shape or k_buf.dtype != v_buf.dtype:
        raise ValueError("the K and V buffers must have one shape and cache type")
    if not len(slots) == len(kv_lens) == q.shape[0]:
        raise ValueError(f"{q.shape[0]} query rows need as many slots and kv_lens, got "
                         f"{len(slots)} and {len(kv_lens)}")
    n_slots, capacity = k_buf.shape[0], k_buf.shape[1]
    for slot, kv_len in zip(slots, kv_lens):  # a plain loop: numpy's is slower at a batch's size
        if not (0 <= slot < n_slots and 1 <= kv_len <= capacity):
            raise ValueError(f"slot {slot} with kv_len {kv_len} is outside the cache "
                             f"({n_slots} slots of {capacity} positions)")


def visible_end(causal: bool, window: int, pos: int, seq_k: int) -> int:
    """One past the newest key a query at `pos` sees: its own position with `causal`; without,
    the last of the window's keys on its far side, or the last key."""
    if causal:
        return min(pos + 1, seq_k)
    return min(pos + window, seq_k) if window else seq_k


def sink_logits(backend, sinks) -> np.ndarray | None:
    """A backend's sinks tensor as float32 numpy [n_heads], None for none."""
    return None if sinks is None else np.asarray(backend.to_numpy(sinks), np.float32).reshape(-1)


def online_softmax_attention(q, k, v, n_heads, n_kv_heads, head_dim, causal, window=0,
                             scale=None, tile=TILE, sinks=None):
    """Flash attention in numpy, vectorised over heads and a block of query rows.

    Walks query blocks of `tile` rows and, for each, key tiles of `tile` keys. Per query row it
    keeps the running max m, running sum l and accumulator acc; a tile that raises the max
    rescales l and acc by exp(m_old - m_new). Causal attention and the sliding window are loop
    bounds at tile level (a block visits only keys from its first row's oldest visible key to
    its last row's diagonal, or without `causal` its newest visible key) plus an in-tile mask
    on the tiles that cross either edge.
    `sinks` (float32 [n_heads] or None) start each head's running max at its sink, with a sum
    of one: the sink's column, seen before any key.
    """
    seq_q, seq_k = q.shape[0], k.shape[0]
    offset = seq_k - seq_q  # bottom-right causal alignment: row r sits at position offset + r
    check_prefill(causal, window, seq_q, seq_k)
    group = n_heads // n_kv_heads
    # Heads that share a KV head sit together: [n_kv, group, seq_q, head_dim].
    qh = q.reshape(seq_q, n_kv_heads, group, head_dim).transpose(1, 2, 0, 3)
    kh = k.reshape(seq_k, n_kv_heads, 1, head_dim).transpose(1, 2, 0, 3)  # [n_kv, 1, seq_k, hd]
    vh = v.reshape(seq_k, n_kv_heads, 1, head_dim).transpose(1, 2, 0, 3)
    out = np.empty((n_kv_heads, group, seq_q, head_dim), dtype=np.float32)
    for q0 in range(0, seq_q, tile):
        q1 = min(q0 + tile, seq_q)
        qb = qh[:, :, q0:q1] * np.float32(score_scale(head_dim, scale))  # [n_kv, group, bq, hd]
        m = np.full(qb.shape[:-1] + (1,), -np.inf, dtype=np.float32)
        l = np.zeros_like(m)
        if sinks is not None:
            m[...] = sinks.reshape(n_kv_heads, group, 1, 1)
            l[...] = np.where(m == -np.inf, np.float32(0), np.float32(1))
        acc = np.zeros(qb.shape, dtype=np.float32)
        k_start = max(0, offset + q0 - window + 1) if window else 0  # the block's oldest key
        k_end = visible_end(causal, window, offset + q1 - 1, seq_k)  # past the last row's newest key
        for k0 in range(k_start, k_end, tile):
            k1 = min(k0 + tile, k_end)
            s = qb @ kh[:, :, k0:k1].swapaxes(-1, -2)  # [n_kv, group, bq, bk]: one tile of scores
            crosses_front = k1 > visible_end(causal, window, offset + q0, seq_k)  # the first row's too
            crosses_window = window and k0 <= offset + q1 - 1 - window
            if crosses_front or crosses_window:
                pos = np.arange(q0, q1)[:, None] + offset  # [bq, 1] query positions
                keys = np.arange(k0, k1)[None, :]
                if causal or window:  # past the newest key a row sees
                    hidden = keys >= (pos + 1 if causal else pos + window)
                else:
                    hidden = np.zeros((q1 - q0, k1 - k0), bool)
                if window:
                    hidden |= keys <= pos - window
                s = np.where(hidden, -np.inf, s)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            # A row whose window starts past this whole tile has seen no key yet (m = -inf):
            # subtracting 0 instead keeps its p and corr at 0 rather than NaN.
            m_sub = np.where(m_new == -np.inf, np.float32(0), m_new)
            corr = np.exp(m - m_sub)  # 1 where the max held, < 1 where this tile raised it
            p = np.exp(s - m_sub)
            l = l * corr + p.sum(axis=-1, keepdims=True)
            acc = acc * corr + p @ vh[:, :, k0:k1]
            m = m_new
        out[:, :, q0:q1] = acc / l
    return out.transpose(2, 0, 1, 3).reshape(seq_q, n_heads * head_dim)
