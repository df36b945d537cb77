"""The Triton decode kernel under Triton's interpreter, on CPU tensors, against a float64
materialized reference: both loop variants, GQA 16:1, 16:2, 16:8 and 9:3, head dim 64 and 128,
KV lengths on and around block edges, one and four new tokens, several split counts. Outputs
and the split kernel's partial buffers are filled with NaN before each run, so an element
either kernel forgets to write fails the comparison."""

from __future__ import annotations

import importlib
import itertools
import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined: @triton.jit reads it

import pytest  # noqa: E402
import torch  # noqa: E402

from inferno.backends import triton_decode as td  # noqa: E402

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


def run_poisoned(q, k, v, kv_len, n_heads, n_kv, head_dim, variant, num_splits, block_n=None):
    """The kernel with NaN-filled output and partials; returns (output, plan)."""
    batch, n_new = (1, q.shape[0]) if q.dim() == 2 else q.shape[:2]
    block_n = block_n or td.default_block_n(head_dim)
    plan = td.plan_splits(kv_len, batch, n_kv, block_n, num_splits, q.device)
    partials = td.alloc_partials(batch, n_new, n_heads, plan.num_splits, head_dim, q.device)
    for p in partials:
        p.fill_(float("nan"))
    out = torch.full_like(q, float("nan"))
    got = td.decode_attention(q, k, v, kv_len, n_heads, n_kv, head_dim, variant=variant,
                              num_splits=num_splits, block_n=block_n, out=out, partials=partials)
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
        call(q, k.half(), v.half(), 10, 16, 2, 64)
    with pytest.raises(ValueError, match="num_splits"):
        call(q, k, v, 10, 16, 2, 64, num_splits=0)
    with pytest.raises(ValueError, match="partials"):  # sized for 2 splits, the plan makes 1
        call(q, k, v, 10, 16, 2, 64, partials=td.alloc_partials(1, 4, 16, 2, 64, "cpu"))
    with pytest.raises(ValueError, match="rows"):
        big_q = torch.randn(9, 16 * 64)  # 16 heads per KV head x 9 tokens > one tile
        call(big_q, k[:, :64], v[:, :64], 10, 16, 1, 64)


def test_default_plan():
    # Interpreter: few programs. Short caches never split below MIN_BLOCKS_PER_SPLIT blocks.
    assert td.plan_splits(1, 1, 8, 64) == td.Plan(1, 64)
    assert td.plan_splits(1000, 1, 1, 64).num_splits == 4  # 2 'SMs' x 2 programs
    assert td.plan_splits(200, 1, 1, 64).num_splits == 1  # 4 blocks: one split
    assert td.plan_splits(1000, 8, 8, 64).num_splits == 1  # 64 programs already
