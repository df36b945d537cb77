"""`torch`: every op in torch, on CUDA, MPS or the CPU.

Weights go to the device once, as float32 or (dtype="bf16") bfloat16; activations and the KV
cache follow the weights' dtype, while norms, RoPE and softmax compute in float32 and round
back. Prefill attention keeps the materialized scores (matmul, scale, causal mask, softmax,
matmul), all heads in one batched matmul per step: on a GPU those matmuls are the fast unit, and
walking K/V tile by tile in Python-issued ops would trade them for many small launches (the
Metal backend in the inferno.rs article refused flash for the same reason); a sliding window is
a band in the mask. Decode attention is the same algorithm over each sequence's cache slot, read
in place. KV caches are torch tensors of the cache type's dtype (f32, f16, bf16; by default the
weights' dtype).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from inferno.backends.base import (CACHE_TYPES, QUANT_TILE, Backend, check_decode, check_experts,
                                   check_prefill, score_scale)
from inferno.formats.quant import QuantTensor
from inferno.errors import InfernoError

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
CACHE_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
GRAPHS = ("on", "eager", "off")
# Most bytes of float32 scores one materialized-attention step may hold; a longer prompt is
# processed in chunks of query rows (each chunk still materializes whole score rows).
SCORE_BYTES = 1 << 30


def available_devices() -> list[str]:
    found = []
    if torch.cuda.is_available():
        found.append("cuda" if torch.cuda.device_count() == 1 else
                     f"cuda (cuda:0..cuda:{torch.cuda.device_count() - 1})")
    if torch.backends.mps.is_available():
        found.append("mps")
    return found + ["cpu"]


def pick_device(device: str | None) -> torch.device:
    """cuda, then mps, then cpu; a named device must parse and exist."""
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        dev = None
    ok = dev is not None and (
        dev.type == "cpu"
        or (dev.type == "cuda" and torch.cuda.is_available()
            and (dev.index or 0) < torch.cuda.device_count())
        or (dev.type == "mps" and torch.backends.mps.is_available() and not dev.index))
    if not ok:
        raise InfernoError(f"device {device!r} is not available here; available: "
                           f"{', '.join(available_devices())}")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def pick_dtype(dtype: str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if dtype not in DTYPES:
        raise InfernoError(f"dtype {dtype!r} is not supported; choose one of: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def pick_graphs(graphs: str | None, device: torch.device) -> str:
    """How decode steps run: "on", the device-resident step captured in CUDA graphs (the
    default on CUDA); "eager", the same step launched op by op (for comparison, and the CPU's
    tests of it); "off", the op-by-op step with host sampling (the default elsewhere)."""
    if graphs is None:
        return "on" if device.type == "cuda" else "off"
    if graphs not in GRAPHS:
        raise InfernoError(f"graphs {graphs!r} is not one of: {', '.join(GRAPHS)}", params=("graphs",))
    if graphs == "on" and device.type != "cuda":
        raise InfernoError(f"CUDA graphs need a CUDA device, not {device.type}: use graphs "
                           f"'eager' or 'off'", params=("graphs",))
    return graphs


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, device: str | None = None, dtype: str | None = None, graphs: str | None = None):
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype)
        self.graphs = pick_graphs(graphs, self.device)
        self.device_step = self.graphs != "off"

    # -- tensors at the edges ------------------------------------------------------------------
    def from_numpy(self, a):
        """A float32 host array, or a QuantTensor dequantised once (weights stay at this
        backend's dtype: its matmuls are the fast unit, not the bytes read)."""
        if isinstance(a, QuantTensor):
            return self._dequantized(a)
        # A read-only view of a mapped file is copied: torch tensors are writable, and on the
        # CPU in float32 .to() would otherwise alias the map.
        a = np.asarray(a)
        a = np.array(a, dtype=np.float32, order="C", copy=None if a.flags.writeable else True)
        return torch.from_numpy(a).to(device=self.device, dtype=self.dtype)

    def weight(self, w):
        return self.from_numpy(w)  # [out, in] is what F.linear reads

    def weight_nbytes(self, w) -> int:
        return w.numel() * w.element_size()

    def quantize_weight(self, w, qtype):
        """The Numba kernel's quantizer (the same bytes as the contract's, many times faster),
        imported here as _dequantized imports its dequantizer."""
        from inferno.backends.numba.qkernels import quantize

        return quantize(w, qtype)

    def _dequantized(self, w: QuantTensor):
        """w at this backend's dtype, dequantised a tile of rows at a time (host memory stays
        bounded by one tile, the whole tensor exists only at the target dtype)."""
        from inferno.backends.numba.qkernels import dequantize

        rows, cols = w.shape
        out = torch.empty(rows, cols, dtype=self.dtype, device=self.device)
        step = max(1, QUANT_TILE // cols)
        for r0 in range(0, rows, step):
            r1 = min(r0 + step, rows)
            out[r0:r1] = torch.from_numpy(dequantize(w, r0, r1)).to(device=self.device, dtype=self.dtype)
        return out

    def to_numpy(self, x) -> np.ndarray:
        return x.detach().to(torch.float32).cpu().numpy()

    def zeros(self, rows: int, cols: int):
        return torch.zeros(rows, cols, dtype=self.dtype, device=self.device)

    @property
    def default_cache_type(self) -> str:
        return next(name for name, dt in CACHE_DTYPES.items() if dt == self.dtype)

    def kv_buffer(self, slots: int, capacity: int, width: int, cache_type: str | None = None):
        cache_type = cache_type or self.default_cache_type
        if cache_type not in CACHE_DTYPES:
            where = ("runs on the CPU backends (cpu, simd, pool) only" if cache_type in CACHE_TYPES
                     else "is not a cache type")
            raise InfernoError(f"cache_type {cache_type!r} {where}; here choose one of: "
                               f"{', '.join(CACHE_DTYPES)}", params=("cache_type",))
        return torch.zeros(slots, capacity, width, dtype=CACHE_DTYPES[cache_type], device=self.device)

    def decode_graphs(self, step, n_slots: int, capacity: int, vocab: int, max_batch: int):
        if self.graphs == "off":
            return None
        from inferno.backends.torch.graphs import DecodeGraphs
        return DecodeGraphs(self, step, n_slots, capacity, vocab, max_batch, capture=self.graphs == "on")

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def peak_memory_bytes(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        if self.device.type == "mps":
            return torch.mps.driver_allocated_memory()  # NOTE: current, MPS keeps no peak
        return super().peak_memory_bytes()

    def close(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        elif self.device.type == "mps":
            torch.mps.empty_cache()

    # -- dense ops ------------------------------------------------------------------------------
    def indices(self, values):
        return torch.from_numpy(np.asarray(values, dtype=np.int64)).to(self.device)

    def _index(self, x):
        """Host integers or an index tensor (left where it is: no host round trip)."""
        return x if isinstance(x, torch.Tensor) else self.indices(x)

    def embedding(self, table, ids: np.ndarray):
        return table.index_select(0, self._index(ids))  # [len(ids), hidden]

    def linear(self, x, w):
        return F.linear(x, w)

    def matmul(self, a, b):
        return a @ b

    def rms_norm(self, x, w, eps: float):
        rows, width = x.shape
        g = x.reshape(rows, width // w.shape[0], w.shape[0]).float()  # [rows, groups, len(w)]
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        return g.reshape(rows, width).to(x.dtype)

    def rope_tables(self, positions: np.ndarray, inv_freq: np.ndarray):
        # The reference's float64 angles on the host (MPS has no float64), moved over once.
        cos, sin = super().rope_tables(positions, inv_freq)
        return torch.from_numpy(cos).to(self.device), torch.from_numpy(sin).to(self.device)

    def apply_rope(self, x, cos, sin, head_dim: int):
        rows, width = x.shape
        h = x.reshape(rows, width // head_dim, 2, head_dim // 2).float()
        x1, x2 = h[:, :, 0], h[:, :, 1]  # [rows, n, head_dim // 2]
        c, s = cos[:, None, :], sin[:, None, :]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=2)
        return out.reshape(rows, width).to(x.dtype)

    def silu_mul(self, gate, up):
        return F.silu(gate) * up

    def moe(self, x, router, experts, top_k: int, norm_topk: bool, biases=None, clamp=None):
        """The reference's algorithm on the device: softmax in float32, top-k (ties to the lower
        expert, as torch.topk breaks them), the rows grouped by expert (one host sync for the
        group sizes), one F.linear per chosen expert and matrix, choices added in rank order.
        gpt-oss's biases and clamped SwiGLU as base.Backend.moe says."""
        gate, up, down = experts
        rb, gb, ub, db = biases if biases is not None else (None,) * 4
        n = router.shape[0]
        if not 1 <= top_k <= n:
            raise ValueError(f"top_k must be between 1 and the {n} experts, got {top_k}")
        inter, hidden = check_experts(n, gate, up, down)
        logits = F.linear(x, router)
        probs = torch.softmax((logits if rb is None else logits + rb).float(), dim=-1)  # [rows, n]
        weights, chosen = torch.topk(probs, top_k, dim=-1)  # [rows, top_k], best first
        if norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # group position -> assignment
        tokens = order // top_k
        y = torch.empty(flat.numel(), hidden, dtype=x.dtype, device=x.device)  # by assignment
        start = 0
        for e, count in enumerate(torch.bincount(flat, minlength=n).tolist()):
            if count:
                at, h = order[start:start + count], x[tokens[start:start + count]]
                g = F.linear(h, gate[e * inter:(e + 1) * inter], None if gb is None else gb[e])
                u = F.linear(h, up[e * inter:(e + 1) * inter], None if ub is None else ub[e])
                act = F.silu(g) * u if clamp is None else clamped_swiglu(g, u, *clamp)
                y[at] = F.linear(act, down[e * hidden:(e + 1) * hidden], None if db is None else db[e])
                start += count
        y = y.reshape(x.shape[0], top_k, hidden)
        weights = weights.to(x.dtype)
        out = weights[:, :1] * y[:, 0]
        for j in range(1, top_k):
            out = out + weights[:, j:j + 1] * y[:, j]
        return out

    def gelu_mul(self, gate, up):
        return F.gelu(gate, approximate="tanh") * up

    def add(self, a, b):
        return a + b

    def softmax_rows(self, x):
        return torch.softmax(x.float(), dim=1).to(x.dtype)

    def scale(self, x, s: float):
        return x * s

    def transpose_2d(self, x):
        return x.t().contiguous()

    def fill_strict_upper_tri(self, x, value: float, offset: int = 0):
        rows, cols = x.shape
        above = torch.ones(rows, cols, dtype=torch.bool, device=x.device).triu(offset + 1)
        return x.masked_fill(above, value)

    def copy_2d_from_cols(self, x, width: int, col: int):
        return x[:, col:col + width].contiguous()

    def copy_2d_into_cols(self, dst, src, col: int):
        dst[:, col:col + src.shape[1]] = src
        return dst

    def rows(self, x, start: int, stop: int):
        return x[start:stop]  # a view

    def take_rows(self, x, rows):
        return x.index_select(0, self._index(rows))

    def write_rows(self, dst, src, start: int):
        dst[start:start + src.shape[0]].copy_(src)

    # -- the KV cache ---------------------------------------------------------------------------
    def write_kv(self, buf, slot: int, start: int, rows) -> None:
        buf[slot, start:start + rows.shape[0]].copy_(rows)  # converts to the cache's dtype

    def write_kv_rows(self, buf, slots, positions, rows) -> None:
        buf.index_put_((self._index(slots), self._index(positions)), rows.to(buf.dtype))

    def read_kv(self, buf, slot: int, start: int, stop: int):
        return buf[slot, start:stop].to(self.dtype)  # a view when the cache has the activations' dtype

    def copy_kv(self, dst, dst_slot: int, src, src_slot: int, start: int, stop: int) -> None:
        if stop > start:  # on the device, as stored
            dst[dst_slot, start:stop].copy_(src[src_slot, start:stop])

    # -- attention ------------------------------------------------------------------------------
    def flash_attention_prefill(self, q, k, v, n_heads: int, n_kv_heads: int, head_dim: int,
                                causal: bool, window: int = 0, scale: float | None = None,
                                sinks=None):
        """Not flash: materialized scores for every head at once (see the module docstring)."""
        return materialized_gqa(q, k, v, n_heads, n_kv_heads, head_dim, causal, window, scale,
                                sinks=sinks)

    def decode_attention(self, q, k_buf, v_buf, slots, kv_lens, n_heads: int, n_kv_heads: int,
                         head_dim: int, window: int = 0, scale: float | None = None, sinks=None):
        """One sequence at a time, each over its own slot's window of keys, read in place; with
        index tensors, the whole batch at once over its slots' every position, masked
        (masked_decode: no host round trip)."""
        if isinstance(kv_lens, torch.Tensor):
            return masked_decode(q, k_buf, v_buf, slots, kv_lens, n_heads, n_kv_heads, head_dim,
                                 window, scale, sinks=sinks)
        check_decode(q, k_buf, v_buf, slots, kv_lens, n_heads, n_kv_heads, head_dim, window)
        out = torch.empty(q.shape[0], n_heads * head_dim, dtype=q.dtype, device=q.device)
        for b, (slot, kv_len) in enumerate(zip(slots, kv_lens)):
            start = max(0, kv_len - window) if window else 0
            k = self.read_kv(k_buf, int(slot), start, int(kv_len))  # [kv_len - start, width]
            v = self.read_kv(v_buf, int(slot), start, int(kv_len))
            out[b:b + 1] = materialized_gqa(q[b:b + 1], k, v, n_heads, n_kv_heads, head_dim,
                                            True, scale=scale, sinks=sinks)
        return out


def sink_softmax(scores, sinks=None):
    """softmax over the last dimension of float32 scores, with `sinks` (None: none), a tensor
    that broadcasts to scores[..., :1] (each row's head's sink), as one more column of every
    row, softmaxed with it and dropped: the contract's definition as it stands (a sink of
    -inf adds exp(-inf) = 0)."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    column = sinks.to(dtype=torch.float32).expand(scores.shape[:-1] + (1,))
    return torch.softmax(torch.cat((scores, column), dim=-1), dim=-1)[..., :-1]


def masked_decode(q, k_buf, v_buf, slots, kv_lens, n_heads: int, n_kv_heads: int, head_dim: int,
                  window: int = 0, scale: float | None = None, sinks=None):
    """Decode attention for a batch whose slots and lengths are index tensors, without reading
    them on the host: each sequence's slot is gathered whole (every position of the cache's
    capacity) and the positions past its length, or older than its window, are masked. Work
    and bytes grow with the capacity, not the lengths: the torch backend's way of keeping the
    step free of host values (the gpu backend's kernel reads only the keys each length needs).
    `sinks` as the backend's decode_attention takes them (sink_softmax)."""
    batch, capacity = q.shape[0], k_buf.shape[1]
    group = n_heads // n_kv_heads
    keys = torch.arange(capacity, device=q.device)
    hidden = keys[None, :] >= kv_lens[:, None]  # [B, capacity]: past the length
    if window:
        hidden |= keys[None, :] < (kv_lens - window)[:, None]  # older than the window
    k = k_buf.index_select(0, slots).to(q.dtype).reshape(batch, capacity, n_kv_heads, head_dim)
    v = v_buf.index_select(0, slots).to(q.dtype).masked_fill(hidden[:, :, None], 0)  # no NaN * 0
    qh = q.reshape(batch, n_kv_heads, group, head_dim)  # [B, n_kv, group, hd]
    scores = torch.matmul(qh, k.permute(0, 2, 3, 1)).float() * score_scale(head_dim, scale)
    scores = scores.masked_fill(hidden[:, None, None, :], -math.inf)  # [B, n_kv, group, capacity]
    column = None if sinks is None else sinks.reshape(n_kv_heads, group, 1)
    probs = sink_softmax(scores, column).to(v.dtype)
    ctx = torch.matmul(probs, v.reshape(batch, capacity, n_kv_heads, head_dim).transpose(1, 2))
    return ctx.reshape(batch, n_heads * head_dim)  # [B, n_kv, group, hd] -> [B, nh * hd]


def materialized_gqa(q, k, v, n_heads: int, n_kv_heads: int, head_dim: int, causal: bool,
                     window: int = 0, scale: float | None = None, sinks=None):
    """softmax(scale * q k^T) v with the scores materialized, heads batched by KV head.

    q [seq_q, n_heads * head_dim]; k, v [seq_k, n_kv_heads * head_dim]. The query heads of one
    KV head are stacked into one matrix, so each KV head is one matmul against its K without
    copying K per query head. Causal is bottom-right aligned: query row i, at position
    p = (seq_k - seq_q) + i, sees keys 0..p, and with a window only p - window < j <= p
    (without causal, |p - j| < window: base.Backend.flash_attention_prefill). Rows
    are taken in chunks so the scores stay under SCORE_BYTES. `sinks` (a tensor [n_heads], or
    None) join each head's softmax as one more column (sink_softmax).
    """
    seq_q, seq_k = q.shape[0], k.shape[0]
    offset = seq_k - seq_q
    check_prefill(causal, window, seq_q, seq_k)
    group = n_heads // n_kv_heads
    kh = k.reshape(seq_k, n_kv_heads, head_dim).permute(1, 2, 0)  # [n_kv, hd, seq_k]
    vh = v.reshape(seq_k, n_kv_heads, head_dim).transpose(0, 1)  # [n_kv, seq_k, hd]
    out = torch.empty_like(q)  # [seq_q, n_heads * hd]
    chunk = max(1, SCORE_BYTES // (4 * n_heads * seq_k))
    for q0 in range(0, seq_q, chunk):
        q1 = min(q0 + chunk, seq_q)
        rows = q1 - q0
        # [n_kv, group * rows, hd]: row (g, i) is query head kv * group + g at position q0 + i
        qh = q[q0:q1].reshape(rows, n_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        qh = qh.reshape(n_kv_heads, group * rows, head_dim)
        scores = torch.bmm(qh, kh).float() * score_scale(head_dim, scale)  # [n_kv, g*rows, seq_k]
        hidden = band_mask(q0, q1, seq_k, offset, causal, window, q.device)  # [rows, seq_k]
        if hidden is not None:
            scores = scores.masked_fill(hidden.repeat(group, 1), -math.inf)
        if sinks is None:
            probs = torch.softmax(scores, dim=-1).to(v.dtype)
        else:  # as [n_kv, group, rows, seq_k]: each head's rows take its sink
            probs = sink_softmax(scores.reshape(n_kv_heads, group, rows, seq_k),
                                 sinks.reshape(n_kv_heads, group, 1, 1))
            probs = probs.reshape(n_kv_heads, group * rows, seq_k).to(v.dtype)
        ctx = torch.bmm(probs, vh)  # [n_kv, group * rows, hd]
        out[q0:q1] = ctx.reshape(n_kv_heads, group, rows, head_dim).permute(2, 0, 1, 3).reshape(
            rows, n_heads * head_dim)
    return out


def band_mask(q0: int, q1: int, seq_k: int, offset: int, causal: bool, window: int, device):
    """[q1 - q0, seq_k] bool, True where query rows q0..q1 (at positions offset + row) must not
    see a key: the future (causal; without, keys past the window's far side) and keys older
    than the window. None when nothing is hidden."""
    front = (offset + q0 + 1) if causal else (offset + q0 + window if window else seq_k)
    future = front < seq_k  # some row of the chunk has keys past its newest
    old = window and offset + q1 - 1 - window >= 0  # some row has keys older than its window
    if not (future or old):
        return None
    pos = torch.arange(q0, q1, device=device)[:, None] + offset
    keys = torch.arange(seq_k, device=device)[None, :]
    hidden = keys > pos if causal else keys >= pos + window  # (not causal: here only with a window)
    return hidden | (keys <= pos - window) if window else hidden


def clamped_swiglu(gate, up, alpha: float, limit: float):
    """base.clamped_swiglu on tensors: (up + 1) * g * sigmoid(alpha g), g = min(gate, limit)."""
    g = gate.clamp(max=limit)
    return (up.clamp(-limit, limit) + 1) * (g * torch.sigmoid(alpha * g))
