"""The Triton decode kernel under Triton's interpreter, on CPU tensors, against a float64
materialized reference: both loop variants, GQA 16:1, 16:2, 16:8 and 9:3, head dim 64 and 128,
KV lengths on and around block edges, one and four new tokens, several split counts; then
batches whose sequences read their own cache slots with their own lengths, sliding windows
(keys older than the window are NaN: the kernel must never load them), a scale, and caches
stored in another dtype than the queries, and attention sinks (joined once per row by the
merge, however many splits). Outputs and the split kernel's partial buffers are filled with
NaN before each run, so an element either kernel forgets to write fails the comparison."""

from __future__ import annotations

import importlib
import itertools
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined: @triton.jit reads it

import pytest  # noqa: E402
import torch  # noqa: E402

from inferno.backends.torch import triton_decode as td  # noqa: E402

if not td.INTERPRET:  # imported earlier in this process for CUDA: define the kernels again
    td = importlib.reload(td)

GQA = [(16, 1), (16, 2), (16, 8), (9, 3)]
HEAD_DIMS = [64, 128]
KV_LENS = [1, 63, 64, 65, 1000]
SPLITS = [None, 1, 2, 3, 7]  # None: the default plan
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


def make_inputs(n_heads, n_kv, head_dim, kv_len, n_new, dtype, batch=None, seed=0):
    """Random q and a cache with a few spare rows past kv_len (poisoned: they must not be read)."""
    g = torch.Generator().manual_seed(seed)
    lead = () if batch is None else (batch,)
    cap = kv_len + 3
    q = torch.randn(*lead, n_new, n_heads * head_dim, generator=g).to(dtype)
    k = torch.randn(*lead, cap, n_kv * head_dim, generator=g).to(dtype)
    v = torch.randn(*lead, cap, n_kv * head_dim, generator=g).to(dtype)
    k[..., kv_len:, :] = float("nan")
    v[..., kv_len:, :] = float("nan")
    return q, k, v


def run_poisoned(q, k, v, kv_len, n_heads, n_kv, head_dim, variant, num_splits, block_n=None,
                 **batch):
    """The kernel with NaN-filled output and partials; returns (output, plan). `batch`: slots,
    window and scale, passed through."""
    n_batch, n_new = (1, q.shape[0]) if q.dim() == 2 else q.shape[:2]
    block_n = block_n or td.default_block_n(head_dim)
    lens = kv_len if isinstance(kv_len, list) else [kv_len]
    window = batch.get("window", 0)
    span = max(min(n, window + n_new - 1) if window else n for n in lens)
    plan = td.plan_splits(span, n_batch, n_kv, block_n, num_splits, q.device)
    partials = td.alloc_partials(n_batch, n_new, n_heads, plan.num_splits, head_dim, q.device)
    for p in partials:
        p.fill_(float("nan"))
    out = torch.full_like(q, float("nan"))
    got = td.decode_attention(q, k, v, kv_len, n_heads, n_kv, head_dim, variant=variant,
                              num_splits=num_splits, block_n=block_n, out=out, partials=partials,
                              **batch)
    assert got is out
    return out, plan


def check(out, q, k, v, kv_len, n_heads, n_kv, head_dim):
    ref = td.reference_attention(q, k, v, kv_len, n_heads, n_kv, head_dim)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert not torch.isnan(out).any(), "an output element was never written"
    err = (out.double() - ref).abs().max().item()
    assert err < TOL[q.dtype], f"max abs error {err:.2e}"


# float32: every combination, the split count varying from case to case.
F32_CASES = [
    (nh, nkv, hd, kv, n_new, SPLITS[i % len(SPLITS)])
    for i, ((nh, nkv), hd, kv, n_new) in enumerate(itertools.product(GQA, HEAD_DIMS, KV_LENS, [1, 4]))
    if kv >= n_new
]


@pytest.mark.parametrize("variant", td.VARIANTS)
@pytest.mark.parametrize("n_heads,n_kv,head_dim,kv_len,n_new,splits", F32_CASES)
def test_float32_matches_reference(variant, n_heads, n_kv, head_dim, kv_len, n_new, splits):
    # block_n 64 at both head dims, so 63/64/65 sit on a block edge either way
    q, k, v = make_inputs(n_heads, n_kv, head_dim, kv_len, n_new, torch.float32, seed=kv_len)
    out, _ = run_poisoned(q, k, v, kv_len, n_heads, n_kv, head_dim, variant, splits, block_n=64)
    check(out, q, k, v, kv_len, n_heads, n_kv, head_dim)


@pytest.mark.parametrize("variant", td.VARIANTS)
@pytest.mark.parametrize("n_heads,n_kv", GQA)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kv_len,n_new,splits", [(65, 1, 2), (1000, 4, 3)])
def test_float16_matches_reference(variant, n_heads, n_kv, head_dim, kv_len, n_new, splits):
    # The default block size (128 keys at head dim 64) here.
    q, k, v = make_inputs(n_heads, n_kv, head_dim, kv_len, n_new, torch.float16, seed=1)
    out, _ = run_poisoned(q, k, v, kv_len, n_heads, n_kv, head_dim, variant, splits)
    check(out, q, k, v, kv_len, n_heads, n_kv, head_dim)


@pytest.mark.parametrize("variant", td.VARIANTS)
def test_split_counts_agree(variant):
    """One input, many ways to cut it: each plan's splits are non-empty whole blocks and every
    cut gives the reference (and the same answer up to float rounding)."""
    n_heads, n_kv, head_dim, kv_len, n_new = 16, 2, 64, 1000, 4
    q, k, v = make_inputs(n_heads, n_kv, head_dim, kv_len, n_new, torch.float32, seed=3)
    seen = set()
    for splits in [1, 2, 3, 4, 5, 8, 15, 16, 40]:
        out, plan = run_poisoned(q, k, v, kv_len, n_heads, n_kv, head_dim, variant, splits,
                                 block_n=64)
        check(out, q, k, v, kv_len, n_heads, n_kv, head_dim)
        assert plan.split_size % 64 == 0
        assert (plan.num_splits - 1) * plan.split_size < kv_len <= plan.num_splits * plan.split_size
        assert plan.num_splits <= min(splits, 16)  # 16 blocks of 64 keys: at most 16 splits
        seen.add(plan.num_splits)
    assert len(seen) >= 5


@pytest.mark.parametrize("variant", td.VARIANTS)
def test_batch_and_odd_head_dim(variant):
    """A leading batch dimension (each sequence its own cache), and a head dim that is not a
    power of two (padded to the tile and masked)."""
    q, k, v = make_inputs(8, 2, 24, 130, 2, torch.float32, batch=3, seed=4)
    out, _ = run_poisoned(q, k, v, 130, 8, 2, 24, variant, 2, block_n=32)
    check(out, q, k, v, 130, 8, 2, 24)
    # and the batch really is per sequence: each equals the unbatched call on its own slice
    for b in range(3):
        one, _ = run_poisoned(q[b], k[b], v[b], 130, 8, 2, 24, variant, 2, block_n=32)
        assert torch.allclose(one, out[b], atol=1e-6)


def test_strided_cache_rows():
    """The cache may be a view with a row stride wider than its features (one layer of a
    bigger buffer), and the default allocations (no out, no partials) are used."""
    g = torch.Generator().manual_seed(5)
    big_k = torch.randn(70, 3 * 128, generator=g)
    big_v = torch.randn(70, 3 * 128, generator=g)
    k, v = big_k[:, 128:256], big_v[:, 128:256]  # [70, 128], row stride 384
    q = torch.randn(1, 16 * 64, generator=g)
    out = td.decode_attention(q, k, v, 66, 16, 2, 64, variant="pingpong", num_splits=2)
    check(out, q, k, v, 66, 16, 2, 64)


def test_variants_agree_closely():
    q, k, v = make_inputs(16, 1, 128, 1000, 1, torch.float32, seed=6)
    a, _ = run_poisoned(q, k, v, 1000, 16, 1, 128, "serial", 3, block_n=64)
    b, _ = run_poisoned(q, k, v, 1000, 16, 1, 128, "pingpong", 3, block_n=64)
    # same blocks, same order of accumulation: the ping-pong only moves when QK^T is issued
    assert torch.allclose(a, b, atol=1e-6, rtol=0)


def slotted_cache(n_slots, capacity, n_kv, head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n_slots, capacity, n_kv * head_dim, generator=g).to(dtype)
                 for _ in range(2))


def poisoned(k, v, slots, kv_lens, n_new, window):
    """Copies of k, v with NaN where no program may load: unused slots, past each length, and
    keys older than the oldest any of the sequence's new tokens sees."""
    k, v = k.clone(), v.clone()
    for x in (k, v):
        x[[s for s in range(x.shape[0]) if s not in slots]] = float("nan")
        for slot, n in zip(slots, kv_lens):
            x[slot, n:] = float("nan")
            if window:
                x[slot, :max(0, n - n_new + 1 - window)] = float("nan")
    return k, v


BATCH_CASES = [  # (n_heads, n_kv, head_dim, slots, kv_lens, n_new, window, splits)
    (16, 2, 64, [3, 0, 2], [1, 64, 200], 1, 0, None),
    (16, 2, 64, [3, 0, 2], [1, 64, 200], 1, 1, 2),
    (9, 3, 64, [1, 2, 0, 3], [65, 127, 300, 63], 1, 5, None),
    (9, 3, 64, [1, 2, 0, 3], [65, 127, 300, 63], 1, 100, 3),
    (16, 8, 128, [2, 1], [129, 300], 1, 64, 2),
    (4, 1, 256, [0, 2], [300, 77], 1, 100, None),  # Gemma 3 270M's heads
    (8, 2, 64, [1, 0], [300, 130], 4, 70, 2),  # four new tokens, each with its own window start
]


@pytest.mark.parametrize("variant", td.VARIANTS)
@pytest.mark.parametrize("n_heads,n_kv,head_dim,slots,kv_lens,n_new,window,splits", BATCH_CASES)
def test_batch_of_slots_lengths_and_windows(variant, n_heads, n_kv, head_dim, slots, kv_lens,
                                            n_new, window, splits):
    k, v = slotted_cache(4, 310, n_kv, head_dim, torch.float32, seed=window)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(len(slots), n_new, n_heads * head_dim, generator=g)
    want = td.reference_attention(q, k, v, kv_lens, n_heads, n_kv, head_dim, slots, window)
    pk, pv = poisoned(k, v, slots, kv_lens, n_new, window)
    out, _ = run_poisoned(q, pk, pv, kv_lens, n_heads, n_kv, head_dim, variant, splits,
                          block_n=64, slots=slots, window=window)
    assert not torch.isnan(out).any(), "an output element was never written, or a key outside its window was read"
    assert (out.double() - want).abs().max().item() < 2e-5
    # each sequence alone gives the same rows
    for b in range(len(slots)):
        one, _ = run_poisoned(q[b:b + 1], pk, pv, kv_lens[b:b + 1], n_heads, n_kv, head_dim,
                              variant, splits, block_n=64, slots=slots[b:b + 1], window=window)
        assert torch.allclose(one[0], out[b], atol=1e-6)


@pytest.mark.parametrize("variant", td.VARIANTS)
def test_more_splits_than_the_merge_holds_at_once(variant):
    """63 splits of one 16-key block each: the merge walks them in chunks of MERGE_SPLITS."""
    q, k, v = make_inputs(16, 1, 64, 1000, 1, torch.float32, seed=8)
    out, plan = run_poisoned(q, k, v, 1000, 16, 1, 64, variant, 63, block_n=16)
    assert plan.num_splits == 63 > td.MERGE_SPLITS
    check(out, q, k, v, 1000, 16, 1, 64)


DEVICE_CASES = [  # (n_heads, n_kv, head_dim, slots, kv_lens, window)
    (16, 2, 64, [3, 0, 2], [1, 64, 300], 0),
    (9, 3, 64, [1, 2, 0, 3], [65, 127, 300, 63], 5),
    (8, 2, 64, [2, 1], [129, 300], 100),
]


@pytest.mark.parametrize("variant", td.VARIANTS)
@pytest.mark.parametrize("splits", [None, 4])
@pytest.mark.parametrize("n_heads,n_kv,head_dim,slots,kv_lens,window", DEVICE_CASES)
def test_lengths_read_from_device_memory(variant, splits, n_heads, n_kv, head_dim, slots, kv_lens, window):
    """decode_attention_device: slots and lengths as tensors the host never reads, the grid
    sized for the cache's capacity (every split a short sequence leaves unused is skipped),
    each sequence cutting its own keys (asked for 4 splits, the 310-row cache's three blocks of
    128 keys make 3, and a sequence of up to 128 keys uses one). Same answer as the reference,
    nothing unread loaded, and the same as the host-planned call up to float rounding."""
    k, v = slotted_cache(4, 310, n_kv, head_dim, torch.float32, seed=len(slots))
    q = torch.randn(len(slots), 1, n_heads * head_dim, generator=torch.Generator().manual_seed(2))
    want = td.reference_attention(q, k, v, kv_lens, n_heads, n_kv, head_dim, slots, window)
    pk, pv = poisoned(k, v, slots, kv_lens, 1, window)
    out = torch.full_like(q, float("nan"))
    got = td.decode_attention_device(q, pk, pv, torch.tensor(slots), torch.tensor(kv_lens), n_heads,
                                     n_kv, head_dim, variant, window=window, out=out,
                                     num_splits=splits)
    assert got is out and not torch.isnan(out).any()
    assert (out.double() - want).abs().max().item() < 2e-5
    host = td.decode_attention(q, pk, pv, kv_lens, n_heads, n_kv, head_dim, variant, slots=slots,
                               window=window)
    assert torch.allclose(host, out, atol=1e-6)


def test_device_call_checks_what_it_can():
    q, k, v = make_inputs(16, 2, 64, 10, 1, torch.float32, batch=2)
    with pytest.raises(ValueError, match="tensors"):
        td.decode_attention_device(q, k, v, [0, 1], torch.tensor([5, 5]), 16, 2, 64)
    with pytest.raises(ValueError, match="tensors"):
        td.decode_attention_device(q, k, v, torch.tensor([0]), torch.tensor([5]), 16, 2, 64)
    with pytest.raises(ValueError, match="multiple"):
        td.decode_attention_device(q, k, v, torch.tensor([0, 1]), torch.tensor([5, 5]), 16, 3, 64)


@pytest.mark.parametrize("q_dtype,cache_dtype", [(torch.float32, torch.float16),
                                                 (torch.float32, torch.bfloat16),
                                                 (torch.bfloat16, torch.float16)])
def test_cache_in_another_dtype(q_dtype, cache_dtype):
    """The cache is widened to float32 as it is loaded: equal to the reference on its values."""
    k, v = slotted_cache(2, 200, 2, 64, cache_dtype, seed=3)
    q = torch.randn(2, 1, 8 * 64, generator=torch.Generator().manual_seed(4)).to(q_dtype)
    got = td.decode_attention(q, k, v, [200, 90], 8, 2, 64, slots=[1, 0], window=64, scale=0.1)
    want = td.reference_attention(q, k, v, [200, 90], 8, 2, 64, [1, 0], 64, 0.1)
    assert got.dtype == q_dtype
    tol = 2e-5 if q_dtype == torch.float32 else 2e-2  # bf16 output rounding
    assert (got.double() - want).abs().max().item() < tol


def sink_logits(n_heads, seed):
    """A sink per head: none (-inf), zero, one larger than any score here (8), one that takes
    nearly all the weight (1e4: the output ~0), the rest random."""
    g = torch.Generator().manual_seed(seed)
    sinks = torch.randn(n_heads, generator=g) * 2
    sinks[:4] = torch.tensor([float("-inf"), 0.0, 8.0, 1e4])
    return sinks


SINK_CASES = [  # (n_heads, n_kv, head_dim, slots, kv_lens, n_new, window, splits)
    (8, 2, 64, [1, 0], [300, 130], 1, 0, 3),  # the longer sequence in three splits
    (8, 2, 64, [1, 0], [300, 130], 4, 70, 2),  # four new tokens, each with its own window start
]


@pytest.mark.parametrize("variant", td.VARIANTS)
@pytest.mark.parametrize("n_heads,n_kv,head_dim,slots,kv_lens,n_new,window,splits", SINK_CASES)
def test_sinks_match_reference(variant, n_heads, n_kv, head_dim, slots, kv_lens, n_new, window,
                               splits):
    """gpt-oss's sinks: one more column of each head's softmax, value 0, unscaled. The merge
    adds it once per row, so a row cut into splits (or not) weighs it once: the reference's
    answer either way, the sink-dominated head ~0."""
    k, v = slotted_cache(2, 310, n_kv, head_dim, torch.float32, seed=9)
    q = torch.randn(len(slots), n_new, n_heads * head_dim, generator=torch.Generator().manual_seed(7))
    sinks = sink_logits(n_heads, seed=n_new)
    want = td.reference_attention(q, k, v, kv_lens, n_heads, n_kv, head_dim, slots, window,
                                  sinks=sinks)
    assert want[..., 3 * head_dim:4 * head_dim].abs().max() < 1e-30  # the 1e4 sink's head
    pk, pv = poisoned(k, v, slots, kv_lens, n_new, window)
    out, plan = run_poisoned(q, pk, pv, kv_lens, n_heads, n_kv, head_dim, variant, splits,
                             block_n=64, slots=slots, window=window, sinks=sinks)
    assert plan.num_splits == splits
    assert not torch.isnan(out).any()
    assert (out.double() - want).abs().max().item() < 2e-5
    one, _ = run_poisoned(q, pk, pv, kv_lens, n_heads, n_kv, head_dim, variant, 1, block_n=64,
                          slots=slots, window=window, sinks=sinks)
    assert torch.allclose(one, out, atol=1e-6)  # one split: the same sum


def test_no_sinks_is_sinks_of_minus_inf():
    """Without sinks the merge starts from -inf and 0, as a sink of -inf makes it: the same
    bits, and the same as before there were sinks (the reference without them)."""
    q, k, v = make_inputs(8, 2, 64, 300, 1, torch.float32, seed=11)
    none, _ = run_poisoned(q, k, v, 300, 8, 2, 64, "serial", 3, block_n=64)
    minus_inf, _ = run_poisoned(q, k, v, 300, 8, 2, 64, "serial", 3, block_n=64,
                                sinks=torch.full((8,), float("-inf")))
    assert torch.equal(none, minus_inf)
    check(none, q, k, v, 300, 8, 2, 64)


def test_sinks_from_device_memory():
    """decode_attention_device takes the sinks too (the captured step's: a layer's weight)."""
    n_heads, n_kv, head_dim, slots, kv_lens, window = 8, 2, 64, [2, 1], [129, 300], 100
    k, v = slotted_cache(4, 310, n_kv, head_dim, torch.float32, seed=2)
    q = torch.randn(len(slots), 1, n_heads * head_dim, generator=torch.Generator().manual_seed(2))
    sinks = sink_logits(n_heads, seed=5)
    want = td.reference_attention(q, k, v, kv_lens, n_heads, n_kv, head_dim, slots, window,
                                  sinks=sinks)
    pk, pv = poisoned(k, v, slots, kv_lens, 1, window)
    out = td.decode_attention_device(q, pk, pv, torch.tensor(slots), torch.tensor(kv_lens),
                                     n_heads, n_kv, head_dim, window=window, num_splits=4,
                                     sinks=sinks)
    assert (out.double() - want).abs().max().item() < 2e-5
    with pytest.raises(ValueError, match="sinks"):
        td.decode_attention(q, k, v, kv_lens, n_heads, n_kv, head_dim, slots=slots,
                            sinks=sinks[:4])


def test_window_sizes_the_splits():
    """A 256-key window at the end of a 100k cache: the programs start at the window (every
    older key is NaN) and the plan is for 256 keys, so partials sized for that plan fit."""
    q, k, v = make_inputs(16, 2, 64, 100_000, 1, torch.float32, seed=2)
    want = td.reference_attention(q, k[-259:-3], v[-259:-3], 256, 16, 2, 64)
    k[:-259], v[:-259] = float("nan"), float("nan")
    plan = td.plan_splits(256, 1, 2, 64)
    partials = td.alloc_partials(1, 1, 16, plan.num_splits, 64, "cpu")
    out = td.decode_attention(q, k, v, 100_000, 16, 2, 64, block_n=64, window=256, partials=partials)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)


def test_bad_arguments():
    q, k, v = make_inputs(16, 2, 64, 10, 4, torch.float32)
    call = td.decode_attention
    with pytest.raises(ValueError, match="variant"):
        call(q, k, v, 10, 16, 2, 64, variant="zigzag")
    with pytest.raises(ValueError, match="kv_len"):
        call(q, k, v, 3, 16, 2, 64)  # fewer keys than new tokens
    with pytest.raises(ValueError, match="kv_len"):
        call(q, k, v, 14, 16, 2, 64)  # past the cache
    with pytest.raises(ValueError, match="multiple"):
        call(q, k, v, 10, 16, 3, 64)
    with pytest.raises(ValueError, match="q must be"):
        call(q, k, v, 10, 8, 2, 64)
    with pytest.raises(ValueError, match="dtype"):
        call(q, k.half(), v, 10, 16, 2, 64)  # K and V stored differently
    with pytest.raises(ValueError, match="num_splits"):
        call(q, k, v, 10, 16, 2, 64, num_splits=0)
    with pytest.raises(ValueError, match="partials"):  # sized for 2 splits, the plan makes 1
        call(q, k, v, 10, 16, 2, 64, partials=td.alloc_partials(1, 4, 16, 2, 64, "cpu"))
    with pytest.raises(ValueError, match="rows"):
        big_q = torch.randn(9, 16 * 64)  # 16 heads per KV head x 9 tokens > one tile
        call(big_q, k[:, :64], v[:, :64], 10, 16, 1, 64)
    with pytest.raises(ValueError, match="slot"):
        call(q, k, v, 10, 16, 2, 64, slots=[1])
    with pytest.raises(ValueError, match="as many"):
        call(q, k, v, [10, 10], 16, 2, 64)
    with pytest.raises(ValueError, match="window"):
        call(q, k, v, 10, 16, 2, 64, window=-1)


def test_default_plan():
    # Interpreter: few programs. Short caches never split below MIN_BLOCKS_PER_SPLIT blocks.
    assert td.plan_splits(1, 1, 8, 64) == td.Plan(1, 64, td.MIN_BLOCKS_PER_SPLIT)
    assert td.plan_splits(1000, 1, 1, 64).num_splits == 4  # 2 'SMs' x 2 programs
    assert td.plan_splits(200, 1, 1, 64).num_splits == 1  # 4 blocks: one split
    assert td.plan_splits(1000, 8, 8, 64).num_splits == 1  # 64 programs already
