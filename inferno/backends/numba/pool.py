"""`pool`: simd's kernels fanned out over the cores.

One job per attention head for flash prefill (each head writes only its own output columns); for
decode, one job per (sequence, range of its keys), each writing its own partial sums, merged
after; rows split across threads for matmul, matvec and the row-wise ops. BLAS inside a
job runs on that job's thread only (see blas.py).

The pool is Numba's own: a `prange` over heads or row ranges, launched from the calling thread,
whose iterations run the serial kernels of dense.py and attention.py on a persistent team of
worker threads. Of the ways to hand out jobs, Numba's OpenMP layer is the one whose launch costs
microseconds rather than tens of them (Python threads pay a futex wake and the GIL handoff per
job; Numba's workqueue layer more): decode makes about 7 launches per layer per token, so only
it keeps dispatch under the bandwidth cost it splits (bench/RESULTS.md, "Figures behind the kernels' shape"). Launches are serialised by a lock: Numba
has one worker team per process, and its workqueue layer aborts when two Python threads launch
into it at once.

Small ops (one decode row of a norm, attention over a short cache) run serially on the calling
thread: a launch costs more than their whole work.

OpenMP's workers spin between launches (that is what makes a launch cheap), and a launch waits for all of them:
with a busy loop in another process on the second core, each launch waited for a descheduled
worker and decode collapsed. Sleeping workers (OMP_WAIT_POLICY=passive) fix the busy case and
halve the quiet one (../shared/facts/pool-contention.md). So before each step pool reads how much
of its cores other processes are using (contention.py) and runs its launches on a team of the
cores left free: the jobs are cut as always, so results do not depend on the load.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import numba as nb
import numpy as np

from inferno.backends.numba import dispatch, jitcache
from inferno.backends.numba.codes import CacheKind, WeightKind
from inferno.backends.numba import attention as A
from inferno.backends.numba import dense as K
from inferno.backends.numba import kv_kernels as KV
from inferno.backends.numba import experts as E
from inferno.backends.numba.experts import NO_ROWS
from inferno.backends.numba.contention import Contention
from inferno.backends.numba import qkernels as Q
from inferno.backends.numba.qkernels import chunk_start
from inferno.formats.quant import QuantTensor
from inferno.backends.numba.simd import SimdBackend, check_float, check_width, contiguous, prefill_tile, token_ids
from inferno.errors import InfernoError

_LAUNCH = threading.Lock()  # NOTE: process-wide, like Numba's worker team it guards
_THREADS_SET = threading.local()  # the count set with nb.set_num_threads, per calling thread


@nb.njit(parallel=True, cache=True)
def _gemm(a, b, out, chunks):
    n = a.shape[0]
    for c in nb.prange(chunks):
        K.gemm_rows(a, b, out, chunk_start(n, c, chunks, 1), chunk_start(n, c + 1, chunks, 1))


@nb.njit(parallel=True, cache=True)
def _rms_norm(x, w, eps, out, chunks):
    n = x.shape[0]
    for c in nb.prange(chunks):
        K.rms_norm_rows(x, w, eps, out, chunk_start(n, c, chunks, 1), chunk_start(n, c + 1, chunks, 1))


@nb.njit(parallel=True, cache=True)
def _rope(x, cos, sin, head_dim, out, chunks):
    n = x.shape[0]
    for c in nb.prange(chunks):
        K.rope_rows(x, cos, sin, head_dim, out, chunk_start(n, c, chunks, 1), chunk_start(n, c + 1, chunks, 1))


@nb.njit(parallel=True, cache=True)
def _glu(gate, up, a, k, out, chunks):
    n = gate.shape[0]
    for c in nb.prange(chunks):
        K.glu_rows(gate, up, a, k, out, chunk_start(n, c, chunks, 1), chunk_start(n, c + 1, chunks, 1))


@nb.njit(parallel=True, cache=True)
def _softmax(x, out, chunks):
    n = x.shape[0]
    for c in nb.prange(chunks):
        K.softmax_rows(x, out, chunk_start(n, c, chunks, 1), chunk_start(n, c + 1, chunks, 1))


@nb.njit(parallel=True, cache=True)
def _scale(x, s, out, chunks):
    n = x.shape[0]
    for c in nb.prange(chunks):
        K.scale_rows(x, s, out, chunk_start(n, c, chunks, 1), chunk_start(n, c + 1, chunks, 1))


@nb.njit(parallel=True, cache=True)
def _fill_upper(x, value, offset, out, chunks):
    n = x.shape[0]
    for c in nb.prange(chunks):
        K.fill_upper_rows(x, value, offset, out, chunk_start(n, c, chunks, 1), chunk_start(n, c + 1, chunks, 1))


@nb.njit(parallel=True, cache=True)
def _flash(q, k, v, out, n_heads, n_kv_heads, head_dim, causal, window, scale, sinks):
    group = n_heads // n_kv_heads
    for h in nb.prange(n_heads):  # one job per head
        # (np.int64: a prange's index is unsigned inside the parallel region, signed where Numba
        # first types the loop; the callee would compile for both)
        A.flash_head(q, k, v, out, np.int64(h), h // group, head_dim, causal, window, scale, sinks)


@functools.cache
def _decode_for(kind: CacheKind):
    """Decode attention on the team for one cache kind alone (its loops compiled for that kind:
    the closure's literal, as qkernels.linear_for's)."""
    kind = int(CacheKind(kind))

    @nb.njit(parallel=True, cache=True, nogil=True)
    def decode_kind(q, k_raw, v_raw, slots, kv_lens, window, scale, sinks, n_kv_heads, head_dim, min_keys):
        part_acc, part_m, part_l = KV.alloc_parts(q, kv_lens, window, min_keys, head_dim)
        for job in nb.prange(q.shape[0] * part_acc.shape[2]):  # (row, range of its keys)
            KV.decode_job(kind, q, k_raw, v_raw, slots, kv_lens, window, scale, sinks, n_kv_heads, head_dim,
                          np.int64(job), min_keys, part_acc, part_m, part_l)  # (np.int64: see _flash)
        return KV.merged(q, part_acc, part_m, part_l)  # on the calling thread, after the jobs
    return jitcache.lazy(decode_kind)


MANY = 3  # weights per linear_many launch: q/k/v; gate/up are padded with NO_ROWS


class PoolBackend(SimdBackend):
    name = "pool"
    # Below these sizes a launch costs more than it saves, and the op runs on the calling thread
    # (a decode row's norm, or attention over a short cache, is a few microseconds of work).
    parallel_min_elements = 1 << 15  # row-wise ops: rows x features; matmuls: multiply-adds
    parallel_min_attention = 1 << 17  # query rows x keys x n_heads x head_dim
    par_activations = Q.PAR_ACTIVATIONS  # a prefill's rows from which its int16 rows are made in parallel
    _one_launch = True  # linear_many's one launch over all its weights (off in every_path)

    def __init__(self, threads: int | None = None, int8_activations: bool | None = None,
                 adaptive: bool = True):
        """`adaptive`: run on the cores that other processes leave free, re-read before each
        step (False: always `threads`, as llama.cpp's --threads)."""
        cores = nb.config.NUMBA_NUM_THREADS  # the worker team's size: the cores, by default
        threads = cores if threads is None else int(threads)
        if not 1 <= threads <= cores:
            raise InfernoError(f"threads must be between 1 and {cores} (Numba's worker threads; "
                               f"set NUMBA_NUM_THREADS to allow more), got {threads}", params=("threads",))
        self.threads = threads  # how work is cut into jobs: the same whatever the load
        # How many of them run it: the cores other processes leave free (contention.py),
        # re-read before each step when `adaptive`.
        self.team = threads
        self.adaptive = adaptive and threads > 1
        self._contention = Contention(threads) if self.adaptive else None
        super().__init__(int8_activations)

    @contextlib.contextmanager
    def every_path(self):
        """Every op launched in parallel, however small (the warm-up's tiny steps then reach
        the kernels of long prompts and long contexts)."""
        if self.threads == 1:
            yield
            return
        saved = self.parallel_min_elements, self.parallel_min_attention, self.decode_min_keys, self.par_activations
        self.parallel_min_elements = self.parallel_min_attention = self.par_activations = 0
        self.decode_min_keys = 1
        self._one_launch = False  # linear_many as past dispatch.FEW_MAX rows: one linear per weight
        try:
            yield
        finally:
            (self.parallel_min_elements, self.parallel_min_attention, self.decode_min_keys,
             self.par_activations) = saved
            self._one_launch = True

    def begin_step(self) -> None:
        """Before a forward step: the team for its launches. A busy core is left out of the
        team rather than waited for at every launch; the jobs stay as they were cut, so the
        results do not change, only which threads compute them."""
        if self._contention is not None:
            self.team = self._contention.update()

    def _repack(self, repack, w):
        """simd's, on the pool's threads."""
        return repack(w, self.threads, self._launch)

    def _launch(self, kernel, *args):
        with _LAUNCH:
            # Numba's thread count belongs to the calling thread; set it when it differs (0.8 us).
            if getattr(_THREADS_SET, "n", None) != self.team:
                nb.set_num_threads(self.team)
                _THREADS_SET.n = self.team
            return kernel(*args)

    def _rowwise(self, serial, parallel, work, out, *args) -> None:
        """Run a row-range kernel over all of out's rows, split across threads when the work
        (elements touched, or multiply-adds) pays for a launch."""
        rows = out.shape[0]
        if self.threads == 1 or rows < 2 or work < self.parallel_min_elements:
            serial(*args, out, 0, rows)
        else:
            self._launch(parallel, *args, out, min(self.threads, rows))

    # -- dense ops ------------------------------------------------------------------------------
    def linear(self, x, w):
        x = contiguous(x)
        out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)  # [rows, out]
        if isinstance(w, QuantTensor):
            check_width(x, w)
            kind, tile = WeightKind.of(w), prefill_tile(w.shape[1])
            legacy = self._legacy
            if self.threads == 1 or out.size * x.shape[1] < self.parallel_min_elements:
                Q.linear_for(kind)(w.data, x, out, tile, self._int8_mode(w), legacy)
            else:
                # Prefill splits tiles of rows: at least one per thread (SmolLM2's 576 rows
                # would otherwise be one tile, on one thread).
                tile = min(tile, -(-w.shape[0] // self.threads))
                self._launch(Q.linear_par_for(kind), w.data, x, out, tile, self.threads,
                             self._int8_mode(w), legacy)
        else:  # float32 (fdot.py: one order of arithmetic, as the quantized kinds')
            check_float(x, w)
            if self.threads == 1 or out.size * x.shape[1] < self.parallel_min_elements:
                Q.linear_for(WeightKind.F32)(w.view(np.uint8), x, out, 0, 0, False)
            else:
                self._launch(Q.linear_par_for(WeightKind.F32), w.view(np.uint8), x, out, 0, self.threads, 0, False)
        return out

    def linear_many(self, x, ws):
        """One launch over all the weights' rows (q/k/v, gate/up) when they are all quantized and
        their kernels can share it (dispatch.shared_launch: a few rows, none through lgemm's GEMM),
        into one buffer whose column ranges are returned (views; contiguous when x has one row);
        otherwise one linear per weight (simd's linear_many, which rounds x once for the legacy
        kinds' int16). (Decode calls this 60 times a token on SmolLM2: one pass over ws gathers
        everything the launch needs.)"""
        x = contiguous(x)
        rows, cols = x.shape
        if self.threads == 1 or not self._one_launch or not all(isinstance(w, QuantTensor) for w in ws):
            return super().linear_many(x, ws)
        kinds = [WeightKind.of(w) for w in ws]
        if not dispatch.shared_launch(rows, kinds, self._legacy):
            return super().linear_many(x, ws)
        datas, total = [], 0
        for w in ws:
            check_width(x, w)
            datas.append(w.data)
            total += w.shape[0]
        if total * x.size < self.parallel_min_elements:
            return super().linear_many(x, ws)
        out = np.empty((rows, total), dtype=np.float32)  # [rows, sum of outs]
        # Always three weights (gate/up gets a weight of no rows, of the first one's kind): one
        # compiled kernel for both, one to load at start-up, not two (each costs the load line tens of ms).
        while len(kinds) < MANY:
            kinds.append(kinds[0])
            datas.append(NO_ROWS)
        mode = max(self._int8_mode(w) for w in ws)
        self._launch(Q.linear_many_par_for(*kinds, self._legacy, mode > 0, dispatch.gemm_size(rows, cols)),
                     tuple(datas), x, out, self.threads, mode)
        views, start = [], 0
        for w in ws:
            views.append(out[:, start:start + w.shape[0]])
            start += w.shape[0]
        return views

    def _quantized(self, x):
        """simd's, a prefill's rows split across threads."""
        if self.threads == 1 or x.shape[0] < self.par_activations:
            return super()._quantized(x)
        return self._launch(Q.quantized_par, x, self.threads)

    def _legacy_gemm(self, xq, w):
        """simd's, the weight's rows split across threads (whole passes of the panels)."""
        if self.threads == 1 or xq[0].shape[0] * w.shape[0] * w.shape[1] < self.parallel_min_elements:
            return super()._legacy_gemm(xq, w)
        out = np.empty((xq[0].shape[0], w.shape[0]), dtype=np.float32)
        self._launch(Q.legacy_gemm_par_for(WeightKind.of(w)), w.data, *xq, out, min(self.threads, w.shape[0]))
        return out

    def _experts(self, w0, w1, x, out0, out1, plan, mode: int) -> None:
        """simd's, every chosen expert's rows cut into one chunk per thread, in one launch."""
        work = x.shape[0] * (out0.shape[1] + out1.shape[1]) * x.shape[1]  # multiply-adds
        if self.threads == 1 or work < self.parallel_min_elements:
            return super()._experts(w0, w1, x, out0, out1, plan, mode)
        k0 = WeightKind.of(w0)
        k1, d1 = E.second_weight(w0, w1)
        self._launch(E.experts_par_for(k0, k1), w0.data, d1, x, out0, out1, plan.starts,
                     plan.experts, prefill_tile(w0.shape[1]), self.threads, mode, self._legacy)

    def embedding(self, table, ids):
        """simd's, with a prefill's many rows split across threads."""
        if (not isinstance(table, QuantTensor) or self.threads == 1
                or len(ids) * table.shape[1] < self.parallel_min_elements):
            return super().embedding(table, ids)
        ids = token_ids(ids, table.shape[0])
        out = np.empty((len(ids), table.shape[1]), dtype=np.float32)  # [len(ids), hidden]
        self._launch(Q.embed_for(WeightKind.of(table), True), table.data, ids, out,
                     min(self.threads, len(ids)))
        return out

    def matmul(self, a, b):
        a, b = contiguous(a), contiguous(b)
        out = np.empty((a.shape[0], b.shape[1]), dtype=np.float32)  # [m, n]
        self._rowwise(K.gemm_rows, _gemm, out.size * a.shape[1], out, a, b)
        return out

    def rms_norm(self, x, w, eps: float):
        x = contiguous(x)
        out = np.empty_like(x)
        self._rowwise(K.rms_norm_rows, _rms_norm, x.size, out, x, w, eps)
        return out

    def apply_rope(self, x, cos, sin, head_dim: int):
        x = contiguous(x)
        out = np.empty_like(x)
        self._rowwise(K.rope_rows, _rope, x.size, out, x, contiguous(cos), contiguous(sin), head_dim)
        return out

    def _glu(self, gate, up, activation):
        """simd's silu_mul and gelu_mul, split across threads."""
        gate, up = contiguous(gate), contiguous(up)
        out = np.empty_like(gate)
        self._rowwise(K.glu_rows, _glu, gate.size, out, gate, up, *activation)
        return out

    def softmax_rows(self, x):
        x = contiguous(x)
        out = np.empty_like(x)
        self._rowwise(K.softmax_rows, _softmax, x.size, out, x)
        return out

    def scale(self, x, s: float):
        x = contiguous(x)
        out = np.empty_like(x)
        self._rowwise(K.scale_rows, _scale, x.size, out, x, float(s))
        return out

    def fill_strict_upper_tri(self, x, value: float, offset: int = 0):
        x = contiguous(x)
        out = np.empty_like(x)
        self._rowwise(K.fill_upper_rows, _fill_upper, x.size, out, x, float(value), int(offset))
        return out

    # -- attention ------------------------------------------------------------------------------
    def _flash(self, work: int, *args) -> None:
        """One job per head when the work pays for a launch; simd's serial loop otherwise."""
        if self.threads == 1 or work < self.parallel_min_attention:
            A.flash_heads(*args)
        else:
            self._launch(_flash, *args)

    def _decode_kernel(self, kind: CacheKind, work: int):
        """The jobs shared out over the team when the work pays for a launch (prange hands each
        thread an equal run of jobs); a small step runs on the calling thread. Either way the
        jobs are cut alike (KV.row_splits), so the results do not depend on which."""
        if self.threads == 1 or work < self.parallel_min_attention:
            return KV.decode_all_for(kind)
        return functools.partial(self._launch, _decode_for(kind))
