"""`gpu`: the torch backend on CUDA, with decode attention through the Triton kernel.

Decode (`decode_attention`, a batch of sequences in their own cache slots, in one launch) runs
inferno/backends/torch/triton_decode.py: GQA-packed tiles, the KV sequence (or its sliding window)
split across programs, the plain KV loop by default (`decode="pingpong"`: FlashAttention-4's
S/P ping-pong, which measured no faster on an H200; the kernel module says why). With index
tensors for slots and lengths (the device-resident decode step, captured in CUDA graphs: the
torch backend's `graphs` option) the kernel reads them from device memory on a fixed grid.
Prefill has two candidates, chosen by `prefill`:
- "sdpa" (the default): torch's scaled_dot_product_attention, which on CUDA dispatches to a
  fused flash or memory-efficient kernel, with a bottom-right causal mask for chunks after a
  cache; in bf16 far faster than materialized scores on an H200 (bench/RESULTS.md);
- "materialized": the torch backend's batched materialized scores (cuBLAS matmuls), a little
  faster than SDPA in float32 there.
Attention sinks (gpt-oss) join every path: in the decode kernel's merge, as a sink column in
the materialized scores, and in SDPA as one more key (sdpa_attention says how).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferno.backends.base import check_decode, check_prefill, score_scale
from inferno.backends.torch.torch_backend import TorchBackend, band_mask, materialized_gqa
from inferno.errors import InfernoError

PREFILL_PATHS = ("sdpa", "materialized")
SINK_DIMS = 2  # head-dim columns sdpa_attention adds to carry a sink (with_sink_key)
DECODE_VARIANTS = ("serial", "pingpong")


class GpuBackend(TorchBackend):
    name = "gpu"

    def __init__(self, dtype: str | None = None, decode: str | None = None,
                 prefill: str | None = None, graphs: str | None = None, *, device: str = "cuda"):
        """`device` is for tests only: a CPU device runs the Triton kernel under its interpreter
        (TRITON_INTERPRET=1); the registry never passes it."""
        decode = decode or "serial"
        prefill = prefill or "sdpa"
        if decode not in DECODE_VARIANTS:
            raise InfernoError(f"decode variant {decode!r} is not one of: {', '.join(DECODE_VARIANTS)}")
        if prefill not in PREFILL_PATHS:
            raise InfernoError(f"prefill path {prefill!r} is not one of: {', '.join(PREFILL_PATHS)}")
        if device != "cpu" and not torch.cuda.is_available():
            raise InfernoError("the gpu backend needs a CUDA GPU; use --backend torch (cuda, mps "
                               "or cpu) or a CPU backend")
        try:
            from inferno.backends.torch import triton_decode
        except ImportError as e:
            raise InfernoError(f"the gpu backend needs triton: pip install -e '.[gpu]' in inferno's folder ({e})") from None
        if device == "cpu" and not triton_decode.INTERPRET:
            raise InfernoError("the gpu backend on the cpu device runs its kernel under Triton's "
                               "interpreter: set TRITON_INTERPRET=1 before importing inferno")
        super().__init__(device=device, dtype=dtype, graphs=graphs)
        self._kernel = triton_decode
        self._meta = (None, None)  # (slots and lengths, their device tensor) of the last step
        self.decode_variant, self.prefill_path = decode, prefill

    def flash_attention_prefill(self, q, k, v, n_heads: int, n_kv_heads: int, head_dim: int,
                                causal: bool, window: int = 0, scale: float | None = None,
                                sinks=None):
        if self.prefill_path == "materialized":
            return materialized_gqa(q, k, v, n_heads, n_kv_heads, head_dim, causal, window, scale,
                                    sinks=sinks)
        return sdpa_attention(q, k, v, n_heads, n_kv_heads, head_dim, causal, window, scale,
                              sinks=sinks)

    def decode_attention(self, q, k_buf, v_buf, slots, kv_lens, n_heads: int, n_kv_heads: int,
                         head_dim: int, window: int = 0, scale: float | None = None, sinks=None):
        """The whole batch in one launch of the Triton kernel (one program per sequence, KV head
        and split), each sequence reading its own slot and length."""
        if isinstance(kv_lens, torch.Tensor):  # index tensors: the device-resident step
            return self._kernel.decode_attention_device(
                q[:, None, :], k_buf, v_buf, slots, kv_lens, n_heads, n_kv_heads, head_dim,
                self.decode_variant, window=window, scale=scale, sinks=sinks)[:, 0, :]
        check_decode(q, k_buf, v_buf, slots, kv_lens, n_heads, n_kv_heads, head_dim, window)
        slots, kv_lens = [int(s) for s in slots], [int(n) for n in kv_lens]
        key = (tuple(slots), tuple(kv_lens))
        if self._meta[0] != key:
            # Every layer of a step decodes the same sequences: their slots and lengths go to
            # the device once a step, not once a layer (a small synchronous copy each).
            self._meta = (key, self._kernel.slot_meta(slots, kv_lens, q.device))
        return self._kernel.decode_attention(
            q[:, None, :], k_buf, v_buf, kv_lens, n_heads, n_kv_heads, head_dim,
            variant=self.decode_variant, slots=slots, window=window, scale=scale,
            meta=self._meta[1], sinks=sinks)[:, 0, :]


def sdpa_attention(q, k, v, n_heads: int, n_kv_heads: int, head_dim: int, causal: bool,
                   window: int = 0, scale: float | None = None, sinks=None):
    """torch's fused attention on our [rows, heads * head_dim] layout; causal bottom-right.

    SDPA has no sinks, so `sinks` become one more key, first (the attention problem one row and
    one key longer at the same causal offset: a dummy first query row, dropped, keeps is_causal's
    fast square case), whose score is the sink (to a float rounding) and whose value is zero
    (with_sink_key): the fused kernel still never materializes the scores, for copies of q, k
    and v with a few more head-dim columns, rather than a per-head [rows, keys] float mask (as
    many bytes as the scores) or a private op for the rows' log-sum-exp."""
    seq_q, seq_k = q.shape[0], k.shape[0]
    check_prefill(causal, window, seq_q, seq_k)
    qh = q.reshape(1, seq_q, n_heads, head_dim).transpose(1, 2)  # [1, nh, seq_q, hd]
    kh = k.reshape(1, seq_k, n_kv_heads, head_dim).transpose(1, 2)  # [1, nkv, seq_k, hd]
    vh = v.reshape(1, seq_k, n_kv_heads, head_dim).transpose(1, 2)
    scale = score_scale(head_dim, scale)
    first = 0  # the first output row that is a real query's
    if sinks is not None:
        qh, kh, vh = with_sink_key(qh, kh, vh, sinks, scale)
        first = 1
    rows, keys = qh.shape[2], kh.shape[2]
    if causal and rows == keys and not window:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # is_causal aligns the diagonal top-left; a chunk after a cache needs it bottom-right,
        # and a window a band: an explicit mask (True: attend).
        hidden = band_mask(0, rows, keys, keys - rows, causal, window, q.device)
        if hidden is not None and sinks is not None:
            hidden[:, 0] = False  # the sink's key: every row sees it, whatever its window
        o = F.scaled_dot_product_attention(qh, kh, vh, scale=scale, enable_gqa=True,
                                           attn_mask=None if hidden is None else ~hidden)
    o = o[:, :, first:, :head_dim]
    return o.transpose(1, 2).reshape(seq_q, n_heads * head_dim)  # [seq_q, nh * hd]


def with_sink_key(qh, kh, vh, sinks, scale: float):
    """q, k, v [1, heads, rows, hd] with the sinks as a first key, and a first (dummy) query
    row, in head dims padded by SINK_DIMS-and-alignment columns: the new key is zero but for
    ones in two extra columns, where each query head carries its sink / scale split in two
    (hi + lo: exact at 16 bits too), so its score is scale * (hi + lo) = the sink, while every
    real key's extra columns are zero and its score is unchanged; its value is zero. A sink of
    -inf (no sink) becomes the most negative finite logit, whose weight exp() rounds to 0."""
    _, n_heads, seq_q, head_dim = qh.shape
    n_kv, seq_k = kh.shape[1], kh.shape[2]
    width = -(-(head_dim + SINK_DIMS) // 8) * 8  # fused kernels want head dims in multiples of 8
    c = sinks.detach().to(device=qh.device, dtype=torch.float64) / scale
    c = c.clamp(min=torch.finfo(qh.dtype).min / 4 / max(scale, 1.0))  # -inf: no sink
    hi = c.to(qh.dtype)
    lo = (c - hi.double()).to(qh.dtype)
    q2 = qh.new_zeros(1, n_heads, seq_q + 1, width)
    q2[:, :, 1:, :head_dim] = qh
    q2[0, :, :, head_dim] = hi[:, None]
    q2[0, :, :, head_dim + 1] = lo[:, None]
    k2 = kh.new_zeros(1, n_kv, seq_k + 1, width)
    k2[:, :, 1:, :head_dim] = kh
    k2[:, :, 0, head_dim:head_dim + SINK_DIMS] = 1
    v2 = vh.new_zeros(1, n_kv, seq_k + 1, width)
    v2[:, :, 1:, :head_dim] = vh
    return q2, k2, v2
