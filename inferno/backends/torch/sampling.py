"""Sampling on the device: the host sampler's rules (inferno/sampling.py) over a batch of
logits rows in torch, so that a decode step hands back one token id per sequence instead of
[batch, vocab] logits.

Every rule is the host's, to the value: the same adjustments in the same float32 order (logit
bias, OpenAI's presence and frequency penalties, the grammar's mask), then in float64
transformers' repetition penalty, greedy argmax, top-k and top-p with ties at their edges kept
by lowest id, min-p, and one inverse-CDF draw in token-id order from the uniform number the host
drew from the sequence's own generator. So a seed gives the tokens the host sampler gives
(tests/test_device_step.py pins them on the CPU), and the draws stay with the sequence, not the
device. Sums are the one difference: a GPU adds in another order (a parallel scan), so a draw or
a top-p or min-p edge that lands within a rounding error of a boundary can fall the other way;
on MPS, which has no float64, within about 1e-7.

Nothing here reads a tensor on the host: it is captured in the decode step's CUDA graph.
"""

from __future__ import annotations

import torch


def work_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


def allowed_tokens(masks, vocab: int):
    """Grammar masks [B, words] int32 (bit i of a row = token i allowed, constrain.py's layout)
    as [B, vocab] bool."""
    ids = torch.arange(vocab, device=masks.device)
    words = masks.index_select(1, ids // 32)  # [B, vocab]: each token's word
    return (words >> (ids % 32).to(torch.int32)) & 1 == 1


def adjust(logits, bias, counts, presence, frequency, allowed, constrained):
    """Sequence._adjusted then apply_mask, for a batch, in float32 as there: logits [B, vocab]
    plus each row's bias row, minus frequency * count + presence where a token was generated,
    -inf where a constrained row's grammar forbids. bias, counts [B, vocab] (the rows of the
    batch's slots); presence, frequency [B]; allowed [B, vocab] bool; constrained [B] bool."""
    x = logits.float() + bias
    penalty = frequency[:, None] * counts.float() + presence[:, None]
    x = torch.where(counts > 0, x - penalty, x)
    return torch.where(allowed | ~constrained[:, None], x, float("-inf"))


def first_of(x, edge, n):
    """inferno.sampling.first_of for each row: every value above the row's edge, and of those
    equal to it the lowest ids, up to n in all. x [B, V]; edge, n [B, 1]."""
    tie = x == edge
    room = n - (x > edge).sum(-1, keepdim=True)
    return (x > edge) | (tie & (tie.cumsum(-1) <= room))


def choose(x, seen, repeat, temperature, top_k, top_p, min_p, draws, greedy_only: bool = False):
    """One token per row of adjusted logits x [B, vocab] (adjust's): `seen` [B, vocab] marks
    the tokens of the prompt and reply so far (repetition penalty `repeat` [B]); temperature,
    top_p, min_p, draws [B] float, top_k [B] int. Rows at temperature 0 take the argmax;
    `greedy_only` computes nothing else (every row is greedy). Returns [B] int64."""
    work = work_dtype(x.device)
    x = x.to(work)
    rep = repeat.to(work)[:, None]
    x = torch.where(seen & (rep != 1), torch.where(x > 0, x / rep, x * rep), x)
    greedy = x.argmax(-1)
    if greedy_only:
        return greedy
    batch, vocab = x.shape
    ordered = x.sort(-1, descending=True).values  # [B, V]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)[:, None]  # [B, 1]
    keep = first_of(x, ordered.gather(1, k - 1), k)  # top-k
    t = torch.where(temperature > 0, temperature, 1.0).to(work)[:, None]
    z_max = ordered[:, :1] / t
    e = torch.where(keep, torch.exp(x / t - z_max), 0.0)
    total = e.sum(-1, keepdim=True)
    probs = e / total
    # The kept probabilities likeliest first are the sorted logits' first k, so no second sort.
    rank = torch.arange(vocab, device=x.device)[None, :]
    ranked = torch.where(rank < k, torch.exp(ordered / t - z_max), 0.0) / total
    cut = (ranked.cumsum(-1) < top_p.to(work)[:, None]).sum(-1, keepdim=True).clamp(max=k - 1)
    nucleus = first_of(probs, ranked.gather(1, cut), cut + 1)
    keep &= nucleus | (top_p >= 1)[:, None]
    keep &= probs >= min_p.to(work)[:, None] * probs.amax(-1, keepdim=True)
    w = torch.where(keep, probs, 0.0)
    cdf = w.cumsum(-1)
    pick = torch.searchsorted(cdf, draws.to(work)[:, None] * cdf[:, -1:], right=True)[:, 0]
    last = torch.where(w > 0, rank, -1).amax(-1)  # a draw that rounded up to the total
    return torch.where(temperature > 0, torch.minimum(pick, last), greedy)


def logprobs(logits, tokens, top: int):
    """Each row's log-probability of its token under the raw logits, and the `top` likeliest
    (values, ids) as sequence.token_logprob reports them."""
    lp = logits.to(work_dtype(logits.device)).log_softmax(-1)  # [B, V]
    chosen = lp.gather(1, tokens[:, None])[:, 0]
    values, ids = lp.topk(top, -1) if top else (lp[:, :0], tokens[:, None][:, :0])
    return chosen, values, ids
