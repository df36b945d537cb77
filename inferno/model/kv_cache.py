"""The KV cache: one K and one V buffer per layer, allocated once, written in place.

Sized for the request (prompt + new tokens), never for the model's whole context: Qwen3-0.6B's
40,960 positions would take 9 GB in float32.
"""

from __future__ import annotations


class KVCache:
    def __init__(self, ops, n_layers: int, capacity: int, kv_width: int):
        self.capacity = capacity
        self.k = [ops.zeros(capacity, kv_width) for _ in range(n_layers)]  # [capacity, n_kv * hd]
        self.v = [ops.zeros(capacity, kv_width) for _ in range(n_layers)]
        self.length = 0  # positions 0..length-1 hold valid keys and values

    def nbytes(self) -> int:
        return sum(4 * buf.shape[0] * buf.shape[1] for buf in self.k + self.v)
