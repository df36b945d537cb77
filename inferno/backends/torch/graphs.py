"""The decode step on the device, sampled there, and on CUDA captured in one graph per batch size.

On a GPU a decode step is hundreds of small launches (every op of every layer), and issued one
by one from Python they, not the card, set the pace. So the step is recorded once as a CUDA
graph and replayed, and nothing in it may need the host: its inputs live in static device
buffers, filled by one copy per step; the model's step reads them as index tensors
(DecoderModel.decode); sampling runs on the device (sampling.py); one token id per sequence
comes back.

    runner = DecodeGraphs(ops, step, n_slots=8, capacity=2048, vocab=151936, max_batch=8)
    tokens, logprobs = runner.run(rows)          # DecodeRows in, token ids [B] out

Batch sizes 1, 2, 4, 8, ... up to max_batch are captured, each twice: greedy (argmax only) and
sampling (top-k, top-p, min-p, a draw); a batch is padded up to the next captured size by
repeating its first row, which then writes the same K/V to the same place and counts nothing
(`valid` 0). Per sequence the runner keeps, for each cache slot, what the penalties need: how
often each token was generated, which were seen (prompt and reply), and the logit bias; a
SlotStart rebuilds a slot's rows when a sequence arrives there. Without capture (`capture`
False: the CPU, or --graphs eager) the same code runs eagerly: tests compare it with the
host's path op for op.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from inferno.backends.base import DecodeRows
from inferno.backends.torch import sampling

INTS = ("ids", "positions", "slots", "top_k", "valid", "constrained")
FLOATS = ("temperature", "top_p", "min_p", "repeat", "presence", "frequency", "draws")


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two at least max_batch (vLLM and SGLang capture
    such a ladder; a batch pads up to the next rung)."""
    sizes = [1]
    while sizes[-1] < max_batch:
        sizes.append(2 * sizes[-1])
    return sizes


class DecodeGraphs:
    def __init__(self, ops, step, n_slots: int, capacity: int, vocab: int, max_batch: int,
                 capture: bool):
        dev = ops.device
        self.step, self.vocab, self.capacity = step, vocab, capacity
        self.sizes = capture_sizes(max_batch)
        size = self.sizes[-1]
        # Every per-row value in one int64 buffer, [column, row] (floats stored as float64
        # bits), so one copy fills them all and every column is a contiguous [rows] tensor.
        pinned = dev.type == "cuda"
        self.staging = torch.zeros(len(INTS) + len(FLOATS), size, dtype=torch.int64, pin_memory=pinned)
        self.inputs = torch.zeros(len(INTS) + len(FLOATS), size, dtype=torch.int64, device=dev)
        floats = self.inputs[len(INTS):].view(torch.float64)
        self.col = {**{n: self.inputs[i] for i, n in enumerate(INTS)},
                    **{n: floats[i] for i, n in enumerate(FLOATS)}}
        words = (vocab + 31) // 32
        self.mask_staging = torch.full((size, words), -1, dtype=torch.int32, pin_memory=pinned)
        self.masks = torch.full((size, words), -1, dtype=torch.int32, device=dev)
        # What the penalties need, per cache slot: [n_slots, vocab].
        self.counts = torch.zeros(n_slots, vocab, dtype=torch.int32, device=dev)  # generated
        self.seen = torch.zeros(n_slots, vocab, dtype=torch.int32, device=dev)  # prompt + reply
        self.bias = torch.zeros(n_slots, vocab, dtype=torch.float32, device=dev)
        self.graphs: dict[tuple[int, bool], tuple] = {}  # (size, greedy) -> (graph, tokens, logits)
        self.pad = capture  # batches padded up to a capture size (eagerly too, where tests set it)
        if capture:
            try:
                self._capture()
            except Exception as e:  # run eagerly rather than not at all, and say so
                self.graphs.clear()
                print(f"note: CUDA graph capture failed ({type(e).__name__}: {e}); decoding "
                      f"without graphs", file=sys.stderr)

    @property
    def captured(self) -> bool:
        return bool(self.graphs)

    def run(self, rows: DecodeRows):
        """One decode step: the rows in, then (tokens [B] int64, logprobs) on the host, where
        logprobs is None unless rows.logprobs >= 0, else (chosen [B], top values [B, k], top
        ids [B, k]) as float64 and int64 arrays."""
        b = len(rows.ids)
        if b > self.sizes[-1]:
            raise ValueError(f"{b} rows exceed the {self.sizes[-1]} this runner was made for")
        size = next(s for s in self.sizes if s >= b) if self.pad else b
        greedy = not np.any(np.asarray(rows.temperature) > 0)
        try:
            self._stage(rows, b, size)
            for start in rows.starts:
                self._start(int(rows.slots[start.row]), start)
            if self.graphs:
                graph, tokens, logits = self.graphs[(size, greedy)]
                graph.replay()
            else:
                tokens, logits = self._body(size, greedy)
            out = tokens[:b].cpu().numpy()  # the step's one wait on the device
        except BaseException:
            # Nothing may still be copying from the pinned buffers when the next step refills them.
            if self.staging.is_pinned():
                torch.cuda.synchronize()
            raise
        if rows.logprobs < 0:
            return out, None
        chosen, values, ids = sampling.logprobs(logits[:b], tokens[:b], rows.logprobs)
        return out, (chosen.cpu().numpy(), values.cpu().numpy(), ids.cpu().numpy())

    # -- internals ------------------------------------------------------------------------------
    def _stage(self, rows: DecodeRows, b: int, size: int) -> None:
        """The rows' values into the device buffers, rows b..size-1 a copy of row 0 that counts
        nothing: one host-to-device copy (two with grammar masks)."""
        host = self.staging.numpy()  # [columns, rows] int64
        values = {"ids": rows.ids, "positions": rows.positions, "slots": rows.slots,
                  "top_k": rows.top_k, "valid": 1,
                  "constrained": 0 if rows.constrained is None else rows.constrained}
        for i, name in enumerate(INTS):
            host[i, :b] = values[name]
        as_floats = host[len(INTS):].view(np.float64)
        for i, name in enumerate(FLOATS):
            as_floats[i, :b] = getattr(rows, name)
        host[:, b:size] = host[:, :1]
        host[INTS.index("valid"), b:size] = 0
        host[INTS.index("constrained"), b:size] = 0
        self.inputs[:, :size].copy_(self.staging[:, :size], non_blocking=True)
        if rows.masks is not None:
            self.mask_staging.numpy()[:b] = rows.masks
            self.masks[:b].copy_(self.mask_staging[:b], non_blocking=True)

    def _start(self, slot: int, start) -> None:
        """A slot's penalty state rebuilt from the host's lists (eager, before the step)."""
        dev = self.counts.device
        for table, ids in ((self.seen, start.seen), (self.counts, start.generated)):
            table[slot].zero_()
            if len(ids):
                idx = torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(dev)
                table[slot].index_put_((idx,), torch.ones_like(idx, dtype=torch.int32), accumulate=True)
        self.bias[slot].zero_()
        if start.bias:
            ids, values = zip(*start.bias)
            self.bias[slot, torch.tensor(ids, device=dev)] = torch.tensor(values, dtype=torch.float32, device=dev)

    def _body(self, b: int, greedy: bool):
        """The step on the first b rows of the buffers: (tokens [b], logits [b, vocab])."""
        c = {name: t[:b] for name, t in self.col.items()}
        slots, ids = c["slots"], c["ids"]
        # The fed token is the sequence's newest: generated, and seen, from this step on.
        one = c["valid"].to(torch.int32)
        self.counts.index_put_((slots, ids), one, accumulate=True)
        self.seen.index_put_((slots, ids), one, accumulate=True)
        logits = self.step(ids, c["positions"], slots, c["positions"] + 1)  # [b, vocab]
        f32 = lambda name: c[name].float()  # noqa: E731
        x = sampling.adjust(logits, self.bias.index_select(0, slots), self.counts.index_select(0, slots),
                            f32("presence"), f32("frequency"),
                            sampling.allowed_tokens(self.masks[:b], self.vocab), c["constrained"] > 0)
        tokens = sampling.choose(x, self.seen.index_select(0, slots) > 0, c["repeat"], c["temperature"],
                                 c["top_k"], c["top_p"], c["min_p"], c["draws"], greedy_only=greedy)
        return tokens, logits

    def _capture(self) -> None:
        """Every size, greedy and sampling, largest first into one memory pool. The buffers
        hold values valid for a capture: slot 0's last position, which no sequence holds yet
        (a cache is captured new, or just grown), and a row that counts nothing."""
        self.inputs.zero_()
        self.col["positions"].fill_(self.capacity - 1)
        self.col["repeat"].fill_(1.0)
        self.col["top_p"].fill_(1.0)
        self.col["temperature"].fill_(1.0)
        pool = None
        side = torch.cuda.Stream()
        for size in reversed(self.sizes):
            for greedy in (True, False):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm up: compile, plan, allocate off the graph
                    self._body(size, greedy)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    tokens, logits = self._body(size, greedy)
                pool = graph.pool()
                self.graphs[(size, greedy)] = (graph, tokens, logits)
        torch.cuda.synchronize()
