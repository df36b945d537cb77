"""The KV cache: per layer one K and one V buffer of `slots` sequences x `capacity` positions,
allocated once and written in place.

A single generation is one slot sized for its request (prompt + new tokens), never for the
model's whole context: Qwen3-0.6B's 40,960 positions would take 9 GB in float32. A batch (the
server) is `slots` fixed slots, as llama.cpp's `--parallel` splits its context: memory is known
up front and no slot waits on another's growth. The element type (`cache_type`: f32, f16, bf16,
q8_0) is the backend's to store; the model only writes rows and asks for attention over them.
"""

from __future__ import annotations


class KVCache:
    def __init__(self, ops, n_layers: int, capacity: int, kv_width: int, *, slots: int = 1,
                 cache_type: str = "f32"):
        self.capacity, self.slots, self.cache_type = capacity, slots, cache_type
        # [slots, capacity, n_kv * hd] each, in the cache type
        self.k = [ops.kv_buffer(slots, capacity, kv_width, cache_type) for _ in range(n_layers)]
        self.v = [ops.kv_buffer(slots, capacity, kv_width, cache_type) for _ in range(n_layers)]
        self.lengths = [0] * slots  # slot s holds valid keys and values at 0..lengths[s]-1
        self._bytes = sum(int(buf.nbytes) for buf in self.k + self.v)  # numpy and torch alike

    @property
    def length(self) -> int:
        """Slot 0's length: the whole story for a single-sequence cache."""
        return self.lengths[0]

    @length.setter
    def length(self, n: int) -> None:
        self.lengths[0] = n

    def nbytes(self) -> int:
        return self._bytes

