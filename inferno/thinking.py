"""A thinking model's reasoning told apart from its answer. Qwen3, QwQ and DeepSeek-R1 reason
between <think> and </think> before they answer; their chat templates say so (they write or
strip the tags). vLLM (`--reasoning-parser`) and llama.cpp's server (`--reasoning-format`, on by
default) send that text as the message's `reasoning_content` and the rest as its `content`; so
does inferno's server.

Only a reply that opens with <think> (after blank space) reasons: a tag later in the answer is
the answer's text, as in llama.cpp. Some templates open the block in the prompt (DeepSeek-R1's,
Qwen3-2507's thinking models end the generation prompt with <think>): the reply then starts
inside it (`OPENED`). The blank lines around the reasoning and between it and the answer are
layout, not text, and are dropped; a reply cut inside its reasoning is all reasoning."""

from __future__ import annotations

from inferno.calls import Delta

OPEN, CLOSE = "<think>", "</think>"
TAGS, OPENED = "tags", "opened"  # a reply may open the block / the prompt opened it
_BLANK = " \t\r\n"


def think_mode(chat_template: str | None, prompt_text: str) -> str | None:
    """How a reply to this prompt may reason: None (its template has no think block), TAGS or
    OPENED (the rendered prompt ends inside an open block)."""
    if not chat_template or OPEN not in chat_template or CLOSE not in chat_template:
        return None
    tail = prompt_text.rstrip(_BLANK)
    return OPENED if tail.endswith(OPEN) else TAGS


def _held(text: str, tag: str) -> int:
    """How many characters at the end of `text` could be the start of `tag`, or blank space
    that may yet come before it: held back until the next piece says."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k + len(text[:-k]) - len(text[:-k].rstrip(_BLANK))
    return len(text) - len(text.rstrip(_BLANK))


class ThinkSplit:
    """feed(text) and finish() as a reply is decoded; the Deltas say what is reasoning and what
    is the answer. The answer goes to `inner` (a tool-call parser: tools.stream_parser), or out
    as content where there is none."""

    def __init__(self, mode: str, inner=None):
        if mode not in (TAGS, OPENED):
            raise ValueError(f"unknown think mode {mode!r}")
        self.inner = inner
        self.state = "reasoning" if mode == OPENED else "start"
        self.held = ""  # text not yet sent: a tag's possible start, or blank space
        self.reasoned = False  # whether reasoning text has gone out (blank space before it is dropped)

    @property
    def count(self) -> int:  # the answer's named calls (tools.StreamParser.count)
        return self.inner.count if self.inner is not None else 0

    @property
    def calls(self) -> list:
        return self.inner.calls if self.inner is not None else []

    def feed(self, piece: str) -> list[Delta]:
        return self._run(piece, final=False)

    def finish(self) -> list[Delta]:
        return self._run("", final=True)

    def _run(self, piece: str, final: bool) -> list[Delta]:
        text, self.held, out = self.held + piece, "", []
        if self.state == "start":
            bare = text.lstrip(_BLANK)
            if bare.startswith(OPEN):
                self.state, text = "reasoning", bare[len(OPEN):]
            elif OPEN.startswith(bare) and not final:  # (blank space, or part of the tag)
                self.held = text
                return out
            else:
                self.state = "answer"
        if self.state == "reasoning":
            end = text.find(CLOSE)
            if end < 0:  # all reasoning so far: out, but for what may be the tag's start
                if final:
                    return out + self._reasoning(text.rstrip(_BLANK)) + self._answer("", final)
                keep = _held(text, CLOSE)
                self.held = text[len(text) - keep:]
                return out + self._reasoning(text[:len(text) - keep])
            out += self._reasoning(text[:end].rstrip(_BLANK))
            self.state, text = "after", text[end + len(CLOSE):]
        if self.state == "after":  # the blank lines between the reasoning and the answer
            text = text.lstrip(_BLANK)
            if not text and not final:
                return out
            self.state = "answer"
        return out + self._answer(text, final)

    def _reasoning(self, text: str) -> list[Delta]:
        if not self.reasoned:
            text = text.lstrip(_BLANK)
        if not text:
            return []
        self.reasoned = True
        return [Delta(reasoning=text)]

    def _answer(self, text: str, final: bool) -> list[Delta]:
        if self.inner is None:
            return [Delta(content=text)] if text else []
        out = self.inner.feed(text) if text else []
        return out + (self.inner.finish() if final else [])
