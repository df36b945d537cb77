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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferno.backends.base import check_decode, check_prefill, score_scale
from inferno.backends.torch.torch_backend import TorchBackend, band_mask, materialized_gqa
from inferno.errors import InfernoError

PREFILL_PATHS = ("sdpa", "materialized")
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
                                causal: bool, window: int = 0, scale: float | None = None):
        if self.prefill_path == "materialized":
            return materialized_gqa(q, k, v, n_heads, n_kv_heads, head_dim, causal, window, scale)
        return sdpa_attention(q, k, v, n_heads, n_kv_heads, head_dim, causal, window, scale)

    def decode_attention(self, q, k_buf, v_buf, slots, kv_lens, n_heads: int, n_kv_heads: int,
                         head_dim: int, window: int = 0, scale: float | None = None):
        """The whole batch in one launch of the Triton kernel (one program per sequence, KV head
        and split), each sequence reading its own slot and length."""
        if isinstance(kv_lens, torch.Tensor):  # index tensors: the device-resident step
            return self._kernel.decode_attention_device(
                q[:, None, :], k_buf, v_buf, slots, kv_lens, n_heads, n_kv_heads, head_dim,
                self.decode_variant, window=window, scale=scale)[:, 0, :]
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
            meta=self._meta[1])[:, 0, :]


def sdpa_attention(q, k, v, n_heads: int, n_kv_heads: int, head_dim: int, causal: bool,
                   window: int = 0, scale: float | None = None):
    """torch's fused attention on our [rows, heads * head_dim] layout; causal bottom-right."""
    seq_q, seq_k = q.shape[0], k.shape[0]
    check_prefill(causal, window, seq_q, seq_k)
    qh = q.reshape(1, seq_q, n_heads, head_dim).transpose(1, 2)  # [1, nh, seq_q, hd]
    kh = k.reshape(1, seq_k, n_kv_heads, head_dim).transpose(1, 2)  # [1, nkv, seq_k, hd]
    vh = v.reshape(1, seq_k, n_kv_heads, head_dim).transpose(1, 2)
    scale = score_scale(head_dim, scale)
    if causal and seq_q == seq_k and not window:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # is_causal aligns the diagonal top-left; a chunk after a cache needs it bottom-right,
        # and a window a band: an explicit mask (True: attend).
        hidden = band_mask(0, seq_q, seq_k, seq_k - seq_q, causal, window, q.device)
        o = F.scaled_dot_product_attention(qh, kh, vh, scale=scale, enable_gqa=True,
                                           attn_mask=None if hidden is None else ~hidden)
    return o.transpose(1, 2).reshape(seq_q, n_heads * head_dim)  # [seq_q, nh * hd]
