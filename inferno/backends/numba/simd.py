"""`simd`: Numba-compiled kernels on one core.

Decode's linear is a matvec kernel that streams each weight row once; prefill's is BLAS sgemm
(one thread), which no hand-written loop here beats. Norms, RoPE, SwiGLU and softmax are Numba
loops with a vectorised exp. Flash prefill walks query blocks x 64-key tiles whose score and value
products are small BLAS GEMMs, with the online softmax between them (a row-at-a-time loop loses
to materialized scores on a machine whose matrix unit is BLAS); decode attention walks one query
row at a time over the cache, read in place.

Weights stay in the Hugging Face [out, in] layout: it is what the matvec reads fastest (each
output is one contiguous row), and sgemm takes it as a transposed operand at no cost (x @ w.T
and x @ w_t measured within 2%), so loading converts nothing.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from inferno.backends.numba import blas, dispatch, jitcache, kpanels, lpanels
from inferno.formats import cache_types
from inferno.backends.numba import attention as A
from inferno.backends.numba import dense as K
from inferno.backends.numba import kv_kernels as KV
from inferno.backends.numba import qkernels as Q
from inferno.backends.numba import experts as E
from inferno.backends.base import (Backend, ExpertPlan, check_decode, check_experts, check_prefill,
                                   check_top_k, clamped_swiglu, score_scale, sink_logits)
from inferno.backends.numba.codes import CacheKind, WeightKind
from inferno.backends.numba.ilanes import fast_int_dot
from inferno.backends.numba import ldot, lgemm
from inferno.backends.numba.ldot import LEGACY_KINDS, eight_lane_floats
from inferno.formats.quant import QuantTensor
from inferno.errors import InfernoError


def contiguous(x) -> np.ndarray:
    """x as a C-contiguous, writable float32 array: the one array type the kernels are compiled
    for (another layout or a read-only array would compile, and run, a second variant)."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable:
        return x  # the usual case, in a quarter of np.require's time
    return np.require(x, np.float32, ("C", "W"))


def reuse_freed_activations() -> None:
    """Keep freed activations in the heap for the next op instead of returning them to the OS.

    glibc hands a freed block above its mmap threshold (128 KiB, growing adaptively) back to the
    kernel, and the next activation of that size page-faults on every 4 KiB page it writes: in a
    long prefill that was most of SwiGLU's time and a tenth of the whole pass (bench/RESULTS.md, "Figures behind the kernels' shape"). NOTE: process-wide and permanent; only
    blocks above 32 MiB (glibc's ceiling) are still mapped fresh. Other C libraries: nothing."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)


def quantized_weight(w: QuantTensor):
    """w as the quantized kernels take it: blocks read-only and C-contiguous (one compiled
    variant; a memory-mapped file's view already is, so nothing is copied). A F16/BF16 weight
    whose rows are not whole 32-weight groups is the one exception: float32."""
    if w.qtype.block == 1 and w.shape[1] % 32:
        return w.dequantize()
    data = np.ascontiguousarray(w.data)
    if data.flags.writeable:
        data = data.view()
        data.flags.writeable = False
    return w if data is w.data else type(w)(w.qtype, w.shape, data, w.outlier_inputs)  # panels stay panels


def prefill_tile(cols: int) -> int:
    """Rows per dequantised tile in the quantized prefill: about 4 MiB of float32, 64 to 1024
    rows. sgemm re-packs the activations for every tile, so short tiles lose (bench/RESULTS.md, "Figures behind the kernels' shape")."""
    return min(1024, max(64, (1 << 20) // cols))


def check_width(x, w: QuantTensor) -> None:
    """The quantized kernels index without bounds checks: x must be as wide as w's rows."""
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[1]} columns, the weight {w.shape[1]}")


def check_float(x, w: np.ndarray) -> None:
    """fdot reads a float matrix's bytes as float32 without bounds checks: it must be float32
    (weight() makes it so) and as wide as x."""
    if w.dtype != np.float32:
        raise ValueError(f"a float weight must be float32 (backend.weight(w)), got {w.dtype}")
    check_width(x, w)


def token_ids(ids, vocab: int) -> np.ndarray:
    """ids as int64, each checked against the table (the kernels index without checks)."""
    ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}), got {ids.min()}..{ids.max()}")
    return ids


class SimdBackend(Backend):
    name = "simd"
    threads = 1
    batch_invariant = True  # every row of a cached step through decode_attention (Backend)
    decode_min_keys = 256  # keys per decode job at the least (kv_kernels.row_splits)
    default_cache_type = "f16"  # llama.cpp's default: half the bytes decode reads, same answers
    compiles_ahead = True  # kernels in a cache other processes share: a helper can compile them (ahead.py)

    def __init__(self, int8_activations: bool | None = None):
        # Products of Q4_K, Q5_K and Q6_K weights with one activation row (decode), a few (the
        # server's batched step) or many (prefill) take those rows as int8 (qdot.py: llama.cpp's
        # Q8_K, plus a row for its remainder where the weight's outlier_inputs says so), by
        # default where x86 multiplies bytes fast (AVX2): 2-2.8x the weights per second on one
        # core. Decoded token by token against transformers the logits stay as close as with
        # float32 activations (bench/RESULTS.md); and one row, a few and many compute a row
        # alike (qdot.k_tail: batch-invariant). False keeps float32 activations.
        self.int8_activations = fast_int_dot() if int8_activations is None else bool(int8_activations)
        # The legacy kinds (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) take theirs as int16, when
        # int8_activations is on, where float vectors are eight lanes (ldot.py: x86 without
        # AVX-512, where their float32 matvec is the slower) or where VNNI multiplies int16 pairs
        # (lgemm.py: a prefill's products at 1.4-2x sgemm's rate; decode in integers there
        # measured even with the float32 kernels); and then one row, a few and many compute a
        # row alike (batch-invariant). Elsewhere the float32 kernels stay.
        self.int16_legacy = eight_lane_floats() or lgemm.FAST
        # Q4_K linear weights repacked into panels of eight rows at load (linear_weight), on the
        # CPUs where decode measured faster so (kpanels.pays_on).
        self.q4k_panels = kpanels.PAYS
        # Q4_0, Q4_1 and MXFP4 linear weights and experts repacked into panels of sixteen rows at
        # load (linear_weight, experts_weight), with AVX-512 BW (lpanels.PAYS).
        self.legacy_panels = lpanels.PAYS
        blas.limit_to_one_thread()  # sgemm on this core only
        jitcache.load_kernels_lazily()  # a warm load skips Numba's compiler set-up
        reuse_freed_activations()
        self._closed = False

    def loaded(self, seconds: float) -> None:
        if jitcache.compiling():
            jitcache.compiled(seconds)

    def _int8_mode(self, w: QuantTensor) -> int:
        """How a product of w with activation rows takes them (dispatch.activation_mode)."""
        return dispatch.activation_mode(self.int8_activations, w)

    @property
    def _legacy(self) -> bool:
        """Whether products of the legacy kinds take their activations as int16 (ldot.py)."""
        return self.int8_activations and self.int16_legacy

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            blas.release()

    def from_numpy(self, a):
        return contiguous(a)

    def quantize_weight(self, w, qtype):
        """As the contract's, on every core, the same bytes (qkernels.quantize)."""
        return Q.quantize(w, qtype)

    def weight(self, w):
        """[out, in] as stored (see the module docstring): a read-only memory-mapped float32 view
        is not copied, and a QuantTensor stays quantized (quantized_weight). Every float weight
        is handed over read-only, mapped or not, so fdot compiles one variant for all."""
        if isinstance(w, QuantTensor):
            return quantized_weight(w)
        w = np.ascontiguousarray(w, dtype=np.float32).view()
        w.flags.writeable = False
        return w

    def linear_weight(self, w):
        """weight(w) in the form this backend's products want, in memory of its own that replaces
        its mapped pages: a Q4_K weight, where its products take int8 activations and panels pay
        on this CPU (q4k_panels), in panels of eight rows (kpanels.py: eight rows' products in
        each vpdpbusd, where qdot's kernels take one); a Q4_0, Q4_1 or MXFP4 weight, where
        these take int16 activations and panels pay (legacy_panels), in panels of sixteen rows
        (lpanels.py: a block's sixteen rows' sums in the lanes of one vector, where ldot's
        kernels reduce each row's)."""
        return self._panels(self.weight(w), 1)

    def experts_weight(self, w, n_expert: int):
        """linear_weight's panels of sixteen rows for a stack of experts, where each expert's
        rows are whole panels."""
        return self._panels(self.weight(w), n_expert)

    def _panels(self, w, groups: int):
        if groups == 1 and self.int8_activations and self.q4k_panels and kpanels.can_repack(w):
            return self._repack(kpanels.repack, w)
        if self._legacy and self.legacy_panels and lpanels.can_repack(w, groups):
            return self._repack(lpanels.repack, w)
        return w

    def _repack(self, repack, w):
        """repack(w) (kpanels' or lpanels') on this core."""
        return repack(w)

    # -- dense ops ------------------------------------------------------------------------------
    def linear(self, x, w):
        x = contiguous(x)
        out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)  # [rows, out]
        if isinstance(w, QuantTensor):
            check_width(x, w)
            Q.linear_for(WeightKind.of(w))(w.data, x, out, prefill_tile(w.shape[1]),
                                           self._int8_mode(w), self._legacy)
        else:  # float32 (fdot.py: one order of arithmetic, as the quantized kinds')
            check_float(x, w)
            Q.linear_for(WeightKind.F32)(w.view(np.uint8), x, out, 0, 0, False)
        return out

    def linear_many(self, x, ws):
        """[linear(x, w) for w in ws], x rounded to int16 rows once for all the legacy kinds that
        take it so (ldot.py) when it has many rows (a prefill's q/k/v, gate/up), not once each."""
        x = contiguous(x)
        if not dispatch.lgemm_rows(x.shape[0], self._legacy):
            return [self.linear(x, w) for w in ws]
        rounds = [type(w) is QuantTensor and WeightKind.of(w) in LEGACY_KINDS for w in ws]
        if sum(rounds) < 2:
            return [self.linear(x, w) for w in ws]
        for w in ws:
            check_width(x, w)
        xq = self._quantized(x)
        return [self._legacy_gemm(xq, w) if r else self.linear(x, w) for w, r in zip(ws, rounds)]

    def _quantized(self, x):
        """x's rows as int16 (ldot.quantized): (x16, dx, xs)."""
        return ldot.quantized(x)

    def _legacy_gemm(self, xq, w):
        """x @ w.T for a legacy kind w, x quantized (`_quantized`), through lgemm's GEMM."""
        out = np.empty((xq[0].shape[0], w.shape[0]), dtype=np.float32)
        Q.legacy_gemm_for(WeightKind.of(w))(w.data, *xq, out)
        return out

    def moe(self, x, router, experts, top_k: int, norm_topk: bool, biases=None, clamp=None):
        """The reference's plan (base.ExpertPlan, routed and combined in experts.py's jitted
        copies of its arithmetic), its experts' matrices multiplied in two calls for the whole
        step (experts.py): gate and up, then down. Float32 experts take the
        reference's loop over experts (a linear per expert: fdot.py). gpt-oss's biases are added
        to each group's rows by expert, its clamped SwiGLU is base.clamped_swiglu."""
        if not all(isinstance(w, QuantTensor) for w in experts):
            return super().moe(x, router, experts, top_k, norm_topk, biases, clamp)
        gate, up, down = experts
        rb, gb, ub, db = biases if biases is not None else (None,) * 4
        x = contiguous(x)
        logits = self.linear(x, router)  # [rows, n_experts]
        if rb is not None:
            logits = logits + rb
        check_top_k(top_k, logits.shape[1])
        plan = ExpertPlan.of(logits.shape[1], *E.route(logits, top_k, norm_topk))
        inter, hidden = check_experts(plan.n_experts, gate, up, down)
        check_width(x, gate)
        xs = x[plan.tokens]  # [rows * top_k, hidden], grouped by expert
        n = xs.shape[0]
        g, u = np.empty((n, inter), np.float32), np.empty((n, inter), np.float32)
        self._experts(gate, up, xs, g, u, plan, max(self._int8_mode(gate), self._int8_mode(up)))
        expert = None if biases is None else np.repeat(plan.experts, np.diff(plan.starts))  # each row's
        if expert is not None:
            g += gb[expert]
            u += ub[expert]
        act = self.silu_mul(g, u) if clamp is None else clamped_swiglu(g, u, *clamp)  # [n, inter]
        y = np.empty((n, hidden), np.float32)
        self._experts(down, None, act, y, np.empty((n, 0), np.float32), plan, self._int8_mode(down))
        if expert is not None:
            y += db[expert]
        return E.combine(y, plan.weights, plan.position)

    def _experts(self, w0, w1, x, out0, out1, plan: ExpertPlan, mode: int) -> None:
        """out0 (and out1) = each of plan's groups of x times its expert's rows of w0 (and w1,
        unless None), in one call on this core."""
        k0 = WeightKind.of(w0)
        k1, d1 = E.second_weight(w0, w1)
        E.experts_for(k0, k1)(w0.data, d1, x, out0, out1, plan.starts, plan.experts,
                              prefill_tile(w0.shape[1]), mode, self._legacy)

    def embedding(self, table, ids):
        if not isinstance(table, QuantTensor):
            return super().embedding(table, ids)
        ids = token_ids(ids, table.shape[0])
        out = np.empty((len(ids), table.shape[1]), dtype=np.float32)  # [len(ids), hidden]
        Q.embed_for(WeightKind.of(table), False)(table.data, ids, out)
        return out

    def rms_norm(self, x, w, eps: float):
        x = contiguous(x)
        out = np.empty_like(x)
        K.rms_norm_rows(x, w, eps, out, 0, x.shape[0])
        return out

    def apply_rope(self, x, cos, sin, head_dim: int):
        x = contiguous(x)
        out = np.empty_like(x)
        K.rope_rows(x, contiguous(cos), contiguous(sin), head_dim, out, 0, x.shape[0])
        return out

    def silu_mul(self, gate, up):
        return self._glu(gate, up, K.SILU)

    def gelu_mul(self, gate, up):
        return self._glu(gate, up, K.GELU_TANH)

    def _glu(self, gate, up, activation):
        gate, up = contiguous(gate), contiguous(up)
        out = np.empty_like(gate)
        K.glu_rows(gate, up, *activation, out, 0, gate.shape[0])
        return out

    def softmax_rows(self, x):
        x = contiguous(x)
        out = np.empty_like(x)
        K.softmax_rows(x, out, 0, x.shape[0])
        return out

    # -- the KV cache ---------------------------------------------------------------------------
    def write_kv(self, buf, slot: int, start: int, rows) -> None:
        check_rows(buf, slot, start, start + rows.shape[0], rows.shape[1])
        KV.cache_ops_for(CacheKind.of(buf)).write(contiguous(rows), buf.view(np.uint8), int(slot), int(start))

    def write_kv_rows(self, buf, slots, positions, rows) -> None:
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        n, width = rows.shape
        if slots.shape != (n,) or positions.shape != (n,):
            raise ValueError(f"{n} rows need {n} slots and positions, got {slots.shape} and {positions.shape}")
        if width != cache_types.width_of(buf):
            raise ValueError(f"rows of {width} features do not fit a cache of {cache_types.width_of(buf)}")
        bad = KV.cache_ops_for(CacheKind.of(buf)).scatter(contiguous(rows), buf.view(np.uint8), slots, positions)
        if bad >= 0:
            raise ValueError(f"slot {slots[bad]}, position {positions[bad]} is outside the cache "
                             f"({buf.shape[0]} slots of {buf.shape[1]} positions)")

    def read_kv(self, buf, slot: int, start: int, stop: int):
        check_rows(buf, slot, start, stop)
        out = np.empty((stop - start, cache_types.width_of(buf)), np.float32)  # [stop - start, width]
        KV.cache_ops_for(CacheKind.of(buf)).read(buf.view(np.uint8), int(slot), int(start), out)
        return out

    # -- attention ------------------------------------------------------------------------------
    def flash_attention_prefill(self, q, k, v, n_heads: int, n_kv_heads: int, head_dim: int,
                                causal: bool, window: int = 0, scale: float | None = None,
                                sinks=None):
        q, k, v = contiguous(q), contiguous(k), contiguous(v)
        check_prefill(causal, window, q.shape[0], k.shape[0])
        out = np.empty((q.shape[0], n_heads * head_dim), dtype=np.float32)  # [seq_q, nh * hd]
        keys = min(k.shape[0], window) if window else k.shape[0]  # keys per query, about
        self._flash(q.shape[0] * keys * n_heads * head_dim, q, k, v, out, n_heads, n_kv_heads,
                    head_dim, bool(causal), int(window), score_scale(head_dim, scale),
                    sink_row(self, sinks, n_heads))
        return out

    def decode_attention(self, q, k_buf, v_buf, slots, kv_lens, n_heads: int, n_kv_heads: int,
                         head_dim: int, window: int = 0, scale: float | None = None, sinks=None):
        check_decode(q, k_buf, v_buf, slots, kv_lens, n_heads, n_kv_heads, head_dim, window)
        if cache_types.width_of(k_buf) != n_kv_heads * head_dim:
            raise ValueError(f"a cache of {cache_types.width_of(k_buf)} features does not hold "
                             f"{n_kv_heads} KV heads of {head_dim}")
        kind = CacheKind.of(k_buf)
        if kind == CacheKind.Q8_0 and head_dim % cache_types.QK8_0:
            # The kernels read a head's blocks whole: heads of 16 would share a block.
            raise InfernoError(f"a q8_0 cache needs a head dim that is a multiple of "
                               f"{cache_types.QK8_0}, got {head_dim}; use --cache-type f16")
        lens = np.ascontiguousarray(kv_lens, dtype=np.int64)  # the model's own arrays: no copy
        if lens.size == 0:
            return np.empty((0, n_heads * head_dim), np.float32)
        sinks = sink_row(self, sinks, n_heads)
        keys = np.minimum(lens, window) if window else lens  # each row's keys
        run = self._decode_kernel(kind, int(keys.sum()) * n_heads * head_dim)
        return run(contiguous(q), k_buf.view(np.uint8), v_buf.view(np.uint8),
                   np.ascontiguousarray(slots, dtype=np.int64), lens, int(window),
                   score_scale(head_dim, scale), sinks, n_kv_heads, head_dim,
                   self.decode_min_keys)  # [B, nh * hd]

    def _flash(self, work: int, *args) -> None:
        """Flash prefill of every head (`work`: query x key x head x head_dim products). Here
        the heads run one after another; the pool backend fans them out."""
        A.flash_heads(*args)

    def _decode_kernel(self, kind: CacheKind, work: int):
        """What runs a decode step's jobs over a cache of `kind` (`work`: key x head x head_dim
        products): here every job in turn."""
        return KV.decode_all_for(kind)


def sink_row(backend, sinks, n_heads: int) -> np.ndarray:
    """`sinks` as the attention kernels take them: float32 [n_heads], -inf for None (no sink).
    Always an array, so one compiled kernel serves models with sinks and without (a kernel
    compiled for None as well would double its cold compile time)."""
    if sinks is None:
        return no_sinks(n_heads)
    row = contiguous(sink_logits(backend, sinks))
    if row.shape != (n_heads,):  # the kernels index it without bounds checks
        raise ValueError(f"sinks must hold one logit per query head ({n_heads}), got {row.shape[0]}")
    return row


@functools.cache
def no_sinks(n_heads: int) -> np.ndarray:
    """All -inf, one array per head count (the kernels only read it): a step without sinks
    allocates nothing for them."""
    return np.full(n_heads, -np.inf, np.float32)


def check_rows(buf, slot: int, start: int, stop: int, width: int | None = None) -> None:
    """The kernels index without bounds checks: a write or read past the buffer must stop here."""
    if not (0 <= slot < buf.shape[0] and 0 <= start <= stop <= buf.shape[1]):
        raise ValueError(f"slot {slot}, positions {start}..{stop} are outside the cache "
                         f"({buf.shape[0]} slots of {buf.shape[1]} positions)")
    if width is not None and width != cache_types.width_of(buf):
        raise ValueError(f"rows of {width} features do not fit a cache of {cache_types.width_of(buf)}")
