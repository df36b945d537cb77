"""OpenAI's request and response shapes, as vLLM's OpenAI layer has them: requests are pydantic
models (the library validates ranges and types; app.py turns its errors into OpenAI's 400 body),
responses are plain dicts built here, once per chunk.

What this server does not do is a 400 naming the field, never a silent ignore. Unknown fields
that change nothing (`user`, `store`, `metadata`...) are ignored, as OpenAI's own API does.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferno.constrain import Unfence, unfence
from inferno.draft import DRAFT_DEFAULT, SPEC_TYPES
from inferno.embedding import encode_base64
from inferno.errors import InfernoError
from inferno.sampling import SamplingDefaults
from inferno.sequence import Event, Options, TokenLogprob
from inferno.tools import parse_reply, stream_parser


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
    "functions": None, "function_call": "none", "audio": None,
    "modalities": ["text"], "prediction": None, "web_search_options": None,
    "echo": False, "suffix": None, "best_of": 1,
}


class Body(BaseModel):
    """A request's part: strict (a JSON string is not a number, nor true an integer: OpenAI
    refuses them too), so what the OpenAPI document says a field takes is what it takes."""

    model_config = ConfigDict(strict=True)


TokenId = Annotated[int, Field(ge=0, lt=2**31)]
Text = Annotated[str, Field(min_length=1)]
# A prompt or input: text, texts, token ids, or lists of token ids; none of them empty.
Prompts = Text | Annotated[list[Text], Field(min_length=1)] | Annotated[list[TokenId], Field(min_length=1)] \
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]


class StreamOptions(Body):
    include_usage: bool = False


class Request(Body):
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
    # llama.cpp's server's extensions: constrain the reply to a JSON Schema, or a GBNF grammar.
    json_schema: dict | None = None
    grammar: str | None = None
    # inferno's: speculative decoding's most tokens drafted a step (0: none), over the server's
    # --spec-type / --draft-max
    speculative: int | None = Field(None, ge=0)
    spec_type: Literal[SPEC_TYPES] | None = None  # and how, over the server's --spec-type

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

    def constraint(self) -> dict | None:
        """What constrains the reply, as Engine.constraint's arguments (None: nothing)."""
        given = {k: v for k, v in (("json_schema", self.json_schema), ("grammar", self.grammar)) if v is not None}
        if len(given) > 1:
            raise APIError(400, "give json_schema or grammar, not both", param="grammar")
        return given or None

    def options(self, defaults: SamplingDefaults, max_tokens: int, logprobs: bool, top_logprobs: int,
                grammar=None, tool_format: str | None = None, speculative: int = 0,
                spec_type: str = "ngram") -> Options:
        """The sampler settings: what the request sets, over the model's defaults (its
        generation config, else llama.cpp's), as vLLM and llama.cpp's server do. `speculative`:
        the server's drafts (--spec-type), unless the request sets its own."""
        bias = []
        for key, value in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit() or not -100 <= value <= 100:
                raise APIError(400, "logit_bias maps token ids to values in [-100, 100]", param="logit_bias")
            bias.append((int(key), float(value)))
        try:
            sampling = defaults.params(seed=self.seed, temperature=self.temperature, top_k=self.top_k,
                                       top_p=self.top_p, min_p=self.min_p, repeat_penalty=self.repetition_penalty)
        except InfernoError as e:  # a value in range for its field that no sampler takes
            param = {"repeat_penalty": "repetition_penalty"}.get(e.params[0], e.params[0]) if e.params else None
            raise APIError(400, str(e).replace("repeat_penalty", "repetition_penalty"), param=param) from None
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if self.speculative is not None:
            speculative = self.speculative
        if self.spec_type is not None:
            spec_type = self.spec_type
            if not speculative and self.speculative is None:
                speculative = DRAFT_DEFAULT  # spec_type alone asks for drafts
        return Options(max_tokens=max_tokens, sampling=sampling, stop=stop,
                       presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                       logit_bias=tuple(bias), logprobs=logprobs, top_logprobs=top_logprobs, grammar=grammar,
                       tool_format=tool_format, speculative=speculative,
                       spec_type=spec_type)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextPart(Body):
    type: Literal["text"]
    text: str


class FunctionCall(Body):
    name: str
    arguments: str | dict = "{}"  # JSON text, as OpenAI sends it


class ToolCallItem(Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallItem] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None
    # an assistant's reasoning, as this server sends it back (vLLM's field): a harmony prompt
    # keeps it across the tool calls of the turn still going on, as gpt-oss's template does
    reasoning_content: str | None = None

    def as_dict(self) -> dict:
        content = self.content if not isinstance(self.content, list) else "".join(p.text for p in self.content)
        if content is None and not self.tool_calls:
            raise APIError(400, f"a {self.role} message needs content", param="messages")
        # OpenAI's "developer" is the system message of templates written before it existed.
        out = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        for key in ("tool_call_id", "name", "reasoning_content"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class FunctionTool(Body):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict | None = None


class Tool(Body):
    type: Literal["function"] = "function"
    function: FunctionTool


class NamedChoice(Body):
    type: Literal["function"] = "function"
    function: dict


class JSONSchemaFormat(Body):
    name: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class ChatRequest(Request):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool = True
    # OpenAI's, for reasoning models: gpt-oss's (harmony's `Reasoning: ...`; medium when not
    # given), or a chat template's that reads it; any other model refuses it (a 400)
    reasoning_effort: Literal["low", "medium", "high"] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        if isinstance(self.tool_choice, NamedChoice):
            name = self.tool_choice.function.get("name")
            if name not in [t.function.name for t in self.tools]:
                raise APIError(400, f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
        if self.calls_tools and ((self.response_format and self.response_format.type != "text")
                                 or super().constraint()):
            raise APIError(400, "response_format, json_schema and grammar cannot be combined with tools "
                           "(tool_choice none leaves them free)", param="response_format")

    @property
    def tool_dicts(self) -> list[dict] | None:
        """The tools as the chat template takes them (OpenAI's shape), or None."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    @property
    def calls_tools(self) -> bool:
        """Tools given and allowed: the reply is parsed for calls."""
        return bool(self.tools) and self.tool_choice != "none"

    def constraint(self) -> dict | None:
        rf = self.response_format
        if rf is not None and rf.type != "text":
            if super().constraint():
                raise APIError(400, "give response_format or json_schema/grammar, not both", param="response_format")
            if rf.type == "json_object":
                return {"json_object": True, "fence": True}
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise APIError(400, "response_format json_schema needs json_schema.schema",
                               param="response_format.json_schema")
            return {"json_schema": rf.json_schema.schema_, "fence": True}
        spec = super().constraint()
        # A chat reply's JSON may come in a ```json fence, which the content never shows.
        return {**spec, "fence": True} if spec and "json_schema" in spec else spec


class CompletionRequest(Request):
    prompt: Prompts
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=5)


class EmbeddingRequest(Body):
    """OpenAI's embeddings request. `normalize` is an extension (vLLM's spelling): false gives
    the pooled vectors as they are."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: Prompts
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    normalize: bool = True

    def check_supported(self) -> None:
        """Every field it takes is implemented."""


def embeddings_body(model: str, vectors: list, prompt_tokens: int, encoding_format: str) -> dict:
    """OpenAI's embeddings response: each input's vector, as floats or base64 float32 bytes."""
    data = [{"object": "embedding", "index": i,
             "embedding": encode_base64(v) if encoding_format == "base64" else v.tolist()}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


# -- responses ------------------------------------------------------------------------------------
class Response:
    """The envelope every chunk or body of one response shares."""

    def __init__(self, kind: Literal["chat", "text"], model: str, tokens: "TokenText",
                 tool_format: str | None = None, fenced: bool = False, think: str | None = None):
        """`tool_format` (tools.FORMATS, or harmony): the replies are parsed for tool calls in
        that format (harmony's for its reasoning too: a harmony model's replies always are).
        `fenced`: their JSON may come in a ```json fence (constrain.fenced), which is removed.
        `think` (thinking.TAGS or OPENED): a reply's think block is its reasoning_content."""
        self.kind, self.model, self.tokens, self.tool_format = kind, model, tokens, tool_format
        self.fenced, self.think = fenced, think
        self.parsers: dict[int, object] = {}  # choice -> its streamed parser (tools.stream_parser)
        self.unfences: dict[int, Unfence] = {}  # choice -> its fence remover
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.offsets: dict[int, int] = {}  # choice -> characters sent, for completions' text_offset
        self.thinking: dict[int, ReasoningTokens] = {}  # choice -> its tokens before its answer

    def envelope(self, choices: list[dict], stream: bool) -> dict:
        obj = {"chat": "chat.completion", "text": "text_completion"}[self.kind] + (".chunk" if stream and self.kind == "chat" else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def chunk_choices(self, ev: Event) -> list[dict]:
        """The streamed choice chunks of `ev`: its text (reasoning, content and tool-call deltas,
        when the reply is parsed), log-probabilities and finish. A harmony reply's tags are
        never sent: its parser reads them."""
        if self.kind == "chat" and self.fenced:
            unfence = self.unfences.setdefault(ev.index, Unfence())
            text = unfence.feed(ev.text) + (unfence.finish() if ev.finish_reason else "")
            return [self.chunk_choice(dataclasses.replace(ev, text=text))]
        if self.kind != "chat" or not self.parsed:
            return [self.chunk_choice(ev)]
        parser = self.parsers.get(ev.index)
        if parser is None:
            parser = self.parsers[ev.index] = stream_parser(self.tool_format, self.think)
        deltas = parser.feed(ev.text) + (parser.finish() if ev.finish_reason else [])
        self.thinking.setdefault(ev.index, ReasoningTokens()).feed(deltas, len(ev.token_ids))
        chunks = []
        for d in deltas:
            if d.reasoning is not None:
                chunks.append({"reasoning_content": d.reasoning})
            elif d.content is not None:
                chunks.append({"content": d.content})
            else:
                call = {"index": d.index, "function": {"arguments": d.arguments}}
                if d.name is not None:
                    call.update(id=d.id, type="function", function={"name": d.name, "arguments": d.arguments})
                chunks.append({"tool_calls": [call]})
        finish = ev.finish_reason
        if finish == "stop" and parser.count:  # (a named call, whole or cut, as parse_calls counts it)
            finish = "tool_calls"
        out = [{"index": ev.index, "delta": delta, "logprobs": None, "finish_reason": None} for delta in chunks]
        if finish or not out and (ev.text or ev.token_ids):
            out.append({"index": ev.index, "delta": {}, "logprobs": None, "finish_reason": finish})
        if out:
            out[0]["logprobs"] = self.logprobs(ev)
        return out

    @property
    def parsed(self) -> bool:
        """Whether a chat reply is parsed (for tool calls, or reasoning), not sent as it comes."""
        return self.tool_format is not None or self.think is not None

    @property
    def reasoning_tokens(self) -> int:
        """The streamed choices' reasoning tokens so far (ReasoningTokens)."""
        return sum(t.count for t in self.thinking.values())

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
        reasoning_tokens = 0
        for index, evs in sorted(by_index.items()):
            text = "".join(e.text for e in evs)
            if self.kind == "chat" and self.fenced:
                text = unfence(text)
            lps = [lp for e in evs for lp in (e.logprobs or ())] if evs[0].logprobs is not None else None
            merged = Event(index, text, [t for e in evs for t in e.token_ids], lps, evs[-1].finish_reason)
            if self.kind == "chat":
                message, finish = {"role": "assistant", "content": text}, merged.finish_reason
                if self.parsed:  # the reply as reasoning, content and calls, as streamed
                    reasoning, content, calls = parse_reply(self.tool_format, text, self.think)
                    if reasoning:  # (parsed again by event: which tokens came before the answer)
                        reasoning_tokens += ReasoningTokens.of(self.tool_format, evs, self.think)
                    message = {"role": "assistant", "content": content or (None if calls else "")}
                    if reasoning:
                        message["reasoning_content"] = reasoning
                    if calls:
                        message["tool_calls"] = [{"id": c.id, "type": "function",
                                                  "function": {"name": c.name, "arguments": c.arguments}}
                                                 for c in calls]
                        finish = "tool_calls" if finish == "stop" else finish
                choices.append({"index": index, "message": message,
                                "logprobs": self.logprobs(merged), "finish_reason": finish})
            else:
                choices.append(self.chunk_choice(merged))
        body = self.envelope(choices, stream=False)
        body["usage"] = usage(prompt_tokens, sum(e.completion_tokens for e in events),
                              sum(e.cached_tokens for e in events), sum(e.drafted_tokens for e in events),
                              sum(e.accepted_tokens for e in events), reasoning_tokens)
        return body


class ReasoningTokens:
    """How many completion tokens a parsed reply spent before its answer (its first content or
    tool call), where it reasoned: OpenAI's usage.completion_tokens_details.reasoning_tokens.
    The format's own markers before the answer (harmony's channel headers) count with the
    reasoning; a reply cut in its reasoning is all reasoning."""

    def __init__(self):
        self.before, self.reasoned, self.answered = 0, False, False

    def feed(self, deltas: list, tokens: int) -> None:
        """One event's parsed deltas and the tokens it took."""
        if self.answered or any(d.reasoning is None for d in deltas):
            self.answered = True
            return
        self.before += tokens
        self.reasoned = self.reasoned or bool(deltas)

    @property
    def count(self) -> int:
        return self.before if self.reasoned else 0

    @classmethod
    def of(cls, tool_format: str | None, events: list[Event], think: str | None = None) -> int:
        """The count for one choice's events, parsed as a stream would be."""
        parser, counter = stream_parser(tool_format, think), cls()
        for i, ev in enumerate(events):
            counter.feed(parser.feed(ev.text) + (parser.finish() if i == len(events) - 1 else []), len(ev.token_ids))
        return counter.count


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, drafted: int = 0,
          accepted: int = 0, reasoning: int = 0) -> dict:
    """OpenAI's usage object; `cached_tokens`: prompt tokens whose K/V a slot already held;
    speculative decoding's drafted tokens as OpenAI's predicted outputs count theirs, accepted
    and rejected (completion_tokens_details, only where something was drafted); `reasoning`: the
    completion tokens a reasoning model spent before its answer (ReasoningTokens; there too, only
    where there were some)."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    details = {}
    if reasoning:
        details["reasoning_tokens"] = reasoning
    if drafted:
        details.update(accepted_prediction_tokens=accepted, rejected_prediction_tokens=drafted - accepted)
    if details:
        out["completion_tokens_details"] = details
    return out


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
