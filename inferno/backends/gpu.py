"""`gpu`: the torch backend on CUDA, with decode attention through the Triton kernel.

Decode (`fused_attention`) runs inferno/backends/triton_decode.py: GQA-packed tiles, the KV
sequence split across programs, and the S/P ping-pong loop by default (`decode="serial"` keeps
the plain loop, for comparison). Prefill has two candidates, chosen by `prefill`:
- "materialized": the torch backend's batched materialized scores (cuBLAS matmuls);
- "sdpa": torch's scaled_dot_product_attention, which on CUDA dispatches to a fused flash or
  memory-efficient kernel, with a bottom-right causal mask for chunks after a cache.
The default is meant to be whichever measures faster on the device: bench/gpu_decode.py times
both on the Qwen3-0.6B shape ("prefill" rows of its table). NOTE: not yet measured (no GPU was
lent when this was written); "sdpa" is the provisional default, since a fused kernel never
writes the [heads, seq, seq] scores to HBM. Revisit with the benchmark's numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferno.backends.base import _no_window_yet
from inferno.backends.torch_backend import TorchBackend, materialized_gqa
from inferno.errors import InfernoError

PREFILL_PATHS = ("sdpa", "materialized")
DECODE_VARIANTS = ("pingpong", "serial")


class GpuBackend(TorchBackend):
    name = "gpu"

    def __init__(self, dtype: str | None = None, decode: str | None = None,
                 prefill: str | None = None, *, device: str = "cuda"):
        """`device` is for tests only: a CPU device runs the Triton kernel under its interpreter
        (TRITON_INTERPRET=1); the registry never passes it."""
        decode = decode or "pingpong"
        prefill = prefill or "sdpa"
        if decode not in DECODE_VARIANTS:
            raise InfernoError(f"decode variant {decode!r} is not one of: {', '.join(DECODE_VARIANTS)}")
        if prefill not in PREFILL_PATHS:
            raise InfernoError(f"prefill path {prefill!r} is not one of: {', '.join(PREFILL_PATHS)}")
        if device != "cpu" and not torch.cuda.is_available():
            raise InfernoError("the gpu backend needs a CUDA GPU; use --backend torch (cuda, mps "
                               "or cpu) or a CPU backend")
        try:
            from inferno.backends import triton_decode
        except ImportError as e:
            raise InfernoError(f"the gpu backend needs triton: pip install -e '.[gpu]' in inferno's folder ({e})") from None
        if device == "cpu" and not triton_decode.INTERPRET:
            raise InfernoError("the gpu backend on the cpu device runs its kernel under Triton's "
                               "interpreter: set TRITON_INTERPRET=1 before importing inferno")
        super().__init__(device=device, dtype=dtype)
        self._kernel = triton_decode
        self.decode_variant, self.prefill_path = decode, prefill

    def flash_attention_prefill(self, q, k, v, n_heads: int, n_kv_heads: int, head_dim: int,
                                causal: bool, window: int = 0, scale: float | None = None):
        _no_window_yet(window, scale)
        if self.prefill_path == "materialized":
            return materialized_gqa(q, k, v, n_heads, n_kv_heads, head_dim, causal)
        return sdpa_attention(q, k, v, n_heads, n_kv_heads, head_dim, causal)

    def fused_attention(self, q, k_cache, v_cache, kv_len: int, n_heads: int, n_kv_heads: int,
                        head_dim: int):
        if (n_heads // n_kv_heads) * q.shape[0] > self._kernel.MAX_ROWS:
            # More new tokens than one tile holds: a prefill-sized chunk, so prefill's path.
            return self.flash_attention_prefill(q, k_cache[:kv_len], v_cache[:kv_len], n_heads,
                                                n_kv_heads, head_dim, True)
        return self._kernel.decode_attention(q, k_cache, v_cache, kv_len, n_heads, n_kv_heads,
                                             head_dim, variant=self.decode_variant)


def sdpa_attention(q, k, v, n_heads: int, n_kv_heads: int, head_dim: int, causal: bool):
    """torch's fused attention on our [rows, heads * head_dim] layout; causal bottom-right."""
    seq_q, seq_k = q.shape[0], k.shape[0]
    qh = q.reshape(1, seq_q, n_heads, head_dim).transpose(1, 2)  # [1, nh, seq_q, hd]
    kh = k.reshape(1, seq_k, n_kv_heads, head_dim).transpose(1, 2)  # [1, nkv, seq_k, hd]
    vh = v.reshape(1, seq_k, n_kv_heads, head_dim).transpose(1, 2)
    if causal and seq_q != seq_k:
        # is_causal aligns the diagonal top-left; a chunk after a cache needs it bottom-right.
        future = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).triu(seq_k - seq_q + 1)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=~future, enable_gqa=True)
    else:
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, enable_gqa=True)
    return o.transpose(1, 2).reshape(seq_q, n_heads * head_dim)  # [seq_q, nh * hd]
