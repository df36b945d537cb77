"""Drafts for speculative decoding: tokens guessed cheaply, which one forward pass then checks.

Prompt lookup (n-gram), as prompt-lookup decoding, vLLM's `ngram` and llama.cpp's
`ngram-simple` draft: find the latest earlier place where the sequence's last n tokens (prompt
included) occurred, longest n first, and propose the tokens that followed it there. A reply that
quotes, summarises or edits its prompt repeats long runs of it, and each run the pass accepts is
that many decode steps saved; free chat finds few matches and drafts nothing.
"""

from __future__ import annotations

NGRAM_MAX, NGRAM_MIN = 3, 2  # the longest and shortest run matched: one token alone drafts badly
DRAFT_MAX = 64


def next_length(length: int, drafted: int, accepted: int, most: int) -> int:
    """The next draft's length after one of `drafted` tokens had `accepted` confirmed:
    transformers' heuristic schedule, two more after a wholly accepted draft, one fewer (not
    below one) otherwise."""
    if drafted == 0:
        return length
    return min(most, length + 2) if accepted == drafted else max(1, length - 1)


class NgramDrafter:
    """One sequence's drafts (the interface every drafter has: `propose` up to some tokens,
    `learn` from how many the model confirmed). The length follows next_length; a draft the
    model rejects from its first token also pauses drafting, for 1, 2, 4 ... up to BACKOFF_MAX
    steps while that goes on, so free text, where lookups rarely hold, pays for few checks."""

    BACKOFF_MAX = 16
    # The first draft's length: up to three rows a step go through the few-row kernels, which
    # cost little more than one; longer drafts are earned by acceptance.
    FIRST = 2

    def __init__(self, most: int):
        self.most = most
        self.length = min(most, self.FIRST)
        self.wait = self.backoff = 0

    def propose(self, tokens: list[int], room: int) -> list[int]:
        """Up to min(length, room) tokens to follow `tokens` (the prompt and the reply so far)."""
        if self.wait:
            self.wait -= 1
            return []
        return ngram_draft(tokens, min(self.length, room))

    def learn(self, drafted: int, accepted: int) -> None:
        self.length = next_length(self.length, drafted, accepted, self.most)
        if drafted and not accepted:
            self.backoff = min(self.BACKOFF_MAX, 2 * self.backoff or 1)
            self.wait = self.backoff
        elif accepted:
            self.backoff = 0


def ngram_draft(tokens: list[int], k: int, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the last n of `tokens`
    (n from n_max down to n_min); none where no such occurrence exists."""
    size = len(tokens)
    if k < 1:
        return []
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        tail = tokens[size - n:]
        first = tail[0]
        # the latest start i < size - n with tokens[i:i + n] == tail
        for i in range(size - n - 1, -1, -1):
            if tokens[i] == first and tokens[i:i + n] == tail:
                return tokens[i + n:i + n + k]
    return []
