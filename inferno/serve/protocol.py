"""OpenAI's request and response shapes, as vLLM's OpenAI layer has them: requests are pydantic
models (the library validates ranges and types; app.py turns its errors into OpenAI's 400 body),
responses are plain dicts built here, once per chunk.

What this server does not do is a 400 naming the field, never a silent ignore. Unknown fields
that change nothing (`user`, `store`, `metadata`...) are ignored, as OpenAI's own API does.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from inferno.model.sampling import SamplingDefaults
from inferno.sequence import Event, Options, TokenLogprob


class APIError(Exception):
    """An error answered as OpenAI's JSON body: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# Fields of OpenAI's API this server does not implement, with the value that asks for nothing.
UNSUPPORTED = {
    "tools": None, "tool_choice": "none", "functions": None, "function_call": "none",
    "parallel_tool_calls": None, "response_format": {"type": "text"}, "audio": None,
    "modalities": ["text"], "prediction": None, "web_search_options": None, "reasoning_effort": None,
    "echo": False, "suffix": None, "best_of": 1,
}


class StreamOptions(BaseModel):
    include_usage: bool = False


class Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # extensions, as vLLM and llama.cpp's server take them
    min_p: float | None = Field(None, ge=0, lt=1)
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def check_supported(self) -> None:
        for name, harmless in UNSUPPORTED.items():
            value = (self.model_extra or {}).get(name)
            if value is not None and value != harmless:
                raise APIError(400, f"{name} is not supported by this server", param=name)
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > 16 or not all(stops):
            raise APIError(400, "stop takes at most 16 non-empty strings", param="stop")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options")

    def options(self, defaults: SamplingDefaults, max_tokens: int, logprobs: bool, top_logprobs: int) -> Options:
        """The sampler settings: what the request sets, over the model's defaults (its
        generation config, else llama.cpp's), as vLLM and llama.cpp's server do."""
        bias = []
        for key, value in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit() or not -100 <= value <= 100:
                raise APIError(400, "logit_bias maps token ids to values in [-100, 100]", param="logit_bias")
            bias.append((int(key), float(value)))
        sampling = defaults.params(seed=self.seed, temperature=self.temperature, top_k=self.top_k,
                                   top_p=self.top_p, min_p=self.min_p, repeat_penalty=self.repetition_penalty)
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return Options(max_tokens=max_tokens, sampling=sampling, stop=stop,
                       presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                       logit_bias=tuple(bias), logprobs=logprobs, top_logprobs=top_logprobs)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def as_dict(self) -> dict:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        # OpenAI's "developer" is the system message of templates written before it existed.
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatRequest(Request):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")


class CompletionRequest(Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=5)


# -- responses ------------------------------------------------------------------------------------
class Response:
    """The envelope every chunk or body of one response shares."""

    def __init__(self, kind: Literal["chat", "text"], model: str, tokens: "TokenText"):
        self.kind, self.model, self.tokens = kind, model, tokens
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.offsets: dict[int, int] = {}  # choice -> characters sent, for completions' text_offset

    def envelope(self, choices: list[dict], stream: bool) -> dict:
        obj = {"chat": "chat.completion", "text": "text_completion"}[self.kind] + (".chunk" if stream and self.kind == "chat" else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def chunk_choice(self, ev: Event) -> dict:
        """One streamed choice: `ev`'s text, log-probabilities and finish."""
        if self.kind == "chat":
            delta = {"content": ev.text} if ev.text or ev.token_ids else {}
            return {"index": ev.index, "delta": delta, "logprobs": self.logprobs(ev),
                    "finish_reason": ev.finish_reason}
        return {"index": ev.index, "text": ev.text, "logprobs": self.logprobs(ev), "finish_reason": ev.finish_reason}

    def logprobs(self, ev: Event) -> dict | None:
        if ev.logprobs is None:
            return None
        if self.kind == "chat":
            return {"content": [self.tokens.chat_entry(lp) for lp in ev.logprobs], "refusal": None}
        offset = self.offsets.get(ev.index, 0)
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for lp in ev.logprobs:
            text = self.tokens.text(lp.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp.logprob)
            out["top_logprobs"].append({self.tokens.text(t): v for t, v in lp.top})
            out["text_offset"].append(offset)
            offset += len(text)
        self.offsets[ev.index] = offset
        return out

    def whole(self, events: list[Event], prompt_tokens: int) -> dict:
        """The non-streamed body: each choice's events folded into one."""
        by_index: dict[int, list[Event]] = {}
        for ev in events:
            by_index.setdefault(ev.index, []).append(ev)
        choices = []
        for index, evs in sorted(by_index.items()):
            text = "".join(e.text for e in evs)
            lps = [lp for e in evs for lp in (e.logprobs or ())] if evs[0].logprobs is not None else None
            merged = Event(index, text, [t for e in evs for t in e.token_ids], lps, evs[-1].finish_reason)
            if self.kind == "chat":
                choices.append({"index": index, "message": {"role": "assistant", "content": text},
                                "logprobs": self.logprobs(merged), "finish_reason": merged.finish_reason})
            else:
                choices.append(self.chunk_choice(merged))
        body = self.envelope(choices, stream=False)
        body["usage"] = usage(prompt_tokens, sum(e.completion_tokens for e in events),
                              sum(e.cached_tokens for e in events))
        return body


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; `cached_tokens`: prompt tokens whose K/V a slot already held."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class TokenText:
    """A token's text and bytes for logprobs. Byte-level BPE vocabularies (GPT-2's, Llama 3's,
    Qwen's, SmolLM2's) spell each byte as a printable character; SentencePiece ones write
    bytes as <0xAB> and spaces as U+2581. A token that is part of a character has bytes that
    are not valid UTF-8 on their own: its text shows U+FFFD, its bytes are exact."""

    def __init__(self, tokenizer):
        self.hf = tokenizer.hf
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def text(self, token_id: int) -> str:
        return self._get(token_id)[0]

    def chat_entry(self, lp: TokenLogprob) -> dict:
        text, raw = self._get(lp.token_id)
        top = [{"token": self.text(t), "logprob": v, "bytes": self._get(t)[1]} for t, v in lp.top]
        return {"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top}

    def _get(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self.cache:
            piece = self.hf.id_to_token(token_id) or ""
            raw = token_bytes(piece)
            self.cache[token_id] = (raw.decode("utf-8", errors="replace"), list(raw))
        return self.cache[token_id]


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte -> printable character map, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_table()


def token_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    if all(c in _BYTE_LEVEL for c in piece):
        return bytes(_BYTE_LEVEL[c] for c in piece)
    return piece.replace("\u2581", " ").encode()
