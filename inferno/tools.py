"""Tool calls (OpenAI `tools`): the format a model's chat template speaks, the calls parsed out of
its reply (whole, or as it streams), and grammars that constrain them.

Formats, chosen from the template (llama.cpp's common/chat.cpp does the same):
- hermes (Qwen2.5, Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, any
  number, after optional text.
- llama3 (Llama 3.1+): the reply is `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>`, several separated by `;`.
- generic (templates without tools; `generic_system_prompt` teaches it): the reply is one JSON
  object, `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"response": "..."}`.
A call that does not parse stays in the content as text. Arguments are JSON text, as OpenAI
sends them: the model's own text of the object, so the streamed fragments and the whole reply
give the same string.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from inferno.constrain import JSON_OPTIONS, json_defaults
from inferno.errors import InfernoError

FORMATS = ("hermes", "llama3", "generic")
OPEN, CLOSE, PYTHON_TAG = "<tool_call>", "</tool_call>", "<|python_tag|>"


def detect_format(chat_template: str | None) -> str:
    t = chat_template or ""
    if OPEN in t:
        return "hermes"
    if PYTHON_TAG in t or ("ipython" in t and "parameters" in t):  # Llama 3.1 / 3.2 / 3.3
        return "llama3"
    return "generic"


def functions(tools) -> list[dict]:
    """OpenAI tools ({"type": "function", "function": {...}}, or the function itself) as
    {"name", "description", "parameters"}, checked."""
    out = []
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InfernoError("each of tools needs a function with a name", params=("tools",))
        params = fn.get("parameters") or {"type": "object"}
        if not isinstance(params, dict):
            raise InfernoError(f"tool {fn['name']}: parameters must be a JSON Schema object",
                               params=("tools",))
        out.append({"name": fn["name"], "description": fn.get("description", ""), "parameters": params})
    return out


def generic_system_prompt(tools) -> str:
    return ("You can call these tools; each one's arguments follow its JSON Schema:\n"
            + json.dumps(functions(tools), ensure_ascii=False, indent=2) + "\n\n"
            "To call tools, reply with only this JSON object, listing one or more calls:\n"
            '{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments>}}]}\n'
            "Otherwise reply with only this JSON object:\n"
            '{"response": "<your reply>"}')


def supports_tools(chat_template: str | None) -> bool:
    """Whether a chat template renders a `tools` variable (Hugging Face's convention)."""
    return bool(chat_template) and re.search(r"\btools\b", chat_template) is not None


def for_template(messages: list[dict], tools, native: bool) -> list[dict]:
    """Messages as a template renders them, tool turns included. `native`: the template takes
    `tools`, assistant `tool_calls` (arguments as an object, which every such template can
    print) and `tool` messages. Otherwise the tools go into the system message in the generic
    format, a call is written back as the generic reply it was, and a tool result is a user
    turn, which any template renders."""
    out = []
    for m in messages:
        m = dict(m)
        calls = [{"type": "function", "id": c.get("id"),
                  "function": {"name": c["function"]["name"], "arguments": _as_object(c["function"].get("arguments"))}}
                 for c in m.get("tool_calls") or ()]
        if native:
            if calls:
                m["tool_calls"] = calls
            out.append(m)
        elif calls:
            out.append({"role": "assistant", "content": json.dumps(
                {"tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                                for c in calls]}, ensure_ascii=False)})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"Tool result ({m.get('tool_call_id') or 'call'}): {m['content']}"})
        else:
            out.append(m)
    if tools and not native:
        prompt = generic_system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": prompt + "\n\n" + out[0]["content"]}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _as_object(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments if arguments is not None else {}


# -- parsing ---------------------------------------------------------------------------------------
@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))


@dataclass
class Delta:
    """Streamed output: content text, or part of tool call `index` (id and name in its first
    delta, then argument fragments that concatenate to its arguments)."""
    content: str | None = None
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


def parse(format: str, text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply: the streamed deltas, collected."""
    p = StreamParser(format)
    content, calls = [], []
    for d in p.feed(text) + p.finish():
        if d.content is not None:
            content.append(d.content)
        elif d.name is not None:
            calls.append(ToolCall(d.name, d.arguments, d.id))
        else:
            calls[d.index].arguments += d.arguments
    return "".join(content), calls


def _call(text: str, key: str) -> ToolCall | None:
    """A call from its JSON text ({"name": ..., key: {...}}), or None if it is not one. The
    arguments are the model's own text of them: re-serialised, 1e999 would become Infinity."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    key = next((k for k in (key, "arguments", "parameters") if k in obj), None)
    if key is None:
        return ToolCall(obj["name"], "{}")
    spans = {k: (s, e) for k, s, e in _members(text, 0)}  # the last of a repeated key, as json.loads
    args, raw = obj[key], text[slice(*spans[key])]
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args, raw = json.loads(args), args
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], raw) if isinstance(args, dict) else None


_WS = re.compile(r"[ \t\n\r]*")


def _members(text: str, i: int) -> list[tuple[str | None, int, int]]:
    """(key, start, end) of each member of the valid JSON object or array at text[i] (key None
    in an array)."""
    close, out = "}" if text[i] == "{" else "]", []
    i = _WS.match(text, i + 1).end()
    while text[i] != close:
        key = None
        if close == "}":
            key, i = json.decoder.scanstring(text, i + 1)
            i = _WS.match(text, _WS.match(text, i).end() + 1).end()  # past ':'
        end = json.JSONDecoder().raw_decode(text, i)[1]
        out.append((key, i, end))
        i = _WS.match(text, end).end()
        i = _WS.match(text, i + 1).end() if text[i] == "," else i
    return out


class _Content:
    """Content as it streams, stripped as the whole would be: leading whitespace dropped,
    trailing whitespace held back until text follows it."""

    def __init__(self):
        self.started, self.held = False, ""

    def push(self, text: str) -> list[Delta]:
        if not self.started:
            text = text.lstrip()
            self.started = bool(text)
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body):]
        return [Delta(content=body)] if body else []


class StreamParser:
    """Feed the reply's text as it is decoded; get content and tool-call deltas. Content that
    may be the start of a call is held back until it is known not to be. A call is emitted
    whole once its JSON is complete (hermes: at `</tool_call>`)."""

    def __init__(self, format: str):
        if format not in FORMATS:
            raise ValueError(f"unknown tool-call format {format!r}")
        self.format = format
        self.buf = ""  # text received and not yet emitted
        self.state = "start"  # start -> text | calls (hermes: text <-> call)
        self.calls = 0
        self.content = _Content()

    def feed(self, piece: str) -> list[Delta]:
        self.buf += piece
        return self._advance(final=False)

    def finish(self) -> list[Delta]:
        return self._advance(final=True)

    def _emit(self, call: ToolCall) -> list[Delta]:
        self.calls += 1
        return [Delta(index=self.calls - 1, id=call.id, name=call.name, arguments=""),
                Delta(index=self.calls - 1, arguments=call.arguments)]

    def _text(self, upto: int) -> list[Delta]:
        text, self.buf = self.buf[:upto], self.buf[upto:]
        return self.content.push(text)

    def _advance(self, final: bool) -> list[Delta]:
        return getattr(self, "_" + self.format)(final)

    def _hermes(self, final: bool) -> list[Delta]:
        out = []
        while True:
            if self.state != "call":
                i = self.buf.find(OPEN)
                if i < 0:  # hold back a tail that could start <tool_call>
                    longest = min(len(OPEN) - 1, len(self.buf))
                    keep = next((k for k in range(longest, 0, -1) if OPEN.startswith(self.buf[-k:])), 0)
                    return out + self._text(len(self.buf) - (0 if final else keep))
                out += self._text(i)
                self.buf, self.state = self.buf[len(OPEN):], "call"
            j = self.buf.find(CLOSE)
            if j < 0 and not final:
                return out
            body, rest = (self.buf[:j], self.buf[j + len(CLOSE):]) if j >= 0 else (self.buf, "")
            call = _call(body.strip(), "arguments")  # an unclosed call at the end counts too
            if call:
                out += self._emit(call)
            else:
                out += self.content.push(OPEN + body + (CLOSE if j >= 0 else ""))
            self.buf, self.state = rest, "text"

    def _llama3(self, final: bool) -> list[Delta]:
        out = []
        while self.state != "text":
            rest = self.buf.lstrip()
            if self.calls:  # after a call: whitespace and one ';' before the next
                if rest.startswith(";"):
                    rest = rest[1:].lstrip()
                elif rest:
                    break
            elif rest.startswith(PYTHON_TAG):
                rest = rest[len(PYTHON_TAG):].lstrip()
            elif rest and PYTHON_TAG.startswith(rest) and not final:
                return out
            if not rest and not final:
                return out
            if not rest.startswith("{"):
                break
            try:
                end = json.JSONDecoder().raw_decode(rest)[1]
            except json.JSONDecodeError:
                if not final:
                    return out  # incomplete, or not JSON: known at the end
                break
            call = _call(rest[:end], "parameters")
            if call is None:
                break
            out += self._emit(call)
            self.buf = rest[end:]
        self.state = "text"  # the rest is content
        return out + self._text(len(self.buf))

    def _generic(self, final: bool) -> list[Delta]:
        rest = self.buf.strip()
        if self.state == "start" and rest and not rest.startswith("{"):
            self.state = "text"
        if self.state == "text":
            return self._text(len(self.buf))
        if not final:
            return []  # a JSON reply is read whole
        try:
            obj, members = json.loads(rest), _members(rest, 0)
        except json.JSONDecodeError:
            obj = members = None
        if isinstance(obj, dict) and list(obj) == ["response"] and isinstance(obj["response"], str):
            self.buf = ""
            return self.content.push(obj["response"])
        calls = None
        if isinstance(obj, dict) and list(obj) == ["tool_calls"] and isinstance(obj["tool_calls"], list):
            _, start, end = members[-1]
            calls = [_call(rest[s:e], "arguments") for _, s, e in _members(rest, start)]
        if not calls or None in calls:
            return self._text(len(self.buf))
        self.buf = ""
        return [d for c in calls for d in self._emit(c)]


# -- grammars (llguidance Lark, for constrain.Grammars.compile(lark=...)) -------------------------
def _json(schema: dict) -> str:
    # lenient: a keyword llguidance does not implement (an unknown "format") is ignored in a
    # tool's parameters rather than failing the request. Closed objects and bounded numbers,
    # as for any schema (constrain.json_defaults).
    return "%json " + json.dumps({"x-guidance": {**JSON_OPTIONS, "lenient": True}, **json_defaults(schema)})


def _one_call(format: str, tools) -> dict:
    """The schema of one call to any of `tools`: its name, then arguments valid for that tool."""
    key = "parameters" if format == "llama3" else "arguments"
    variants = [{"type": "object", "properties": {"name": {"const": f["name"]}, key: f["parameters"]},
                 "required": ["name", key], "additionalProperties": False} for f in functions(tools)]
    if not variants:
        raise InfernoError("tool_choice needs a tool in tools", params=("tools", "tool_choice"))
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def _specials(grammars, tags) -> str | None:
    """A token rule for the special tokens free text may hold (<think>, </think>): to
    llguidance they are not text. None where there are none."""
    if grammars is None:
        return None
    eos = grammars.eos_ids
    ids = sorted(i for t, i in grammars.special_tokens.items() if t not in tags and i not in eos)
    ranges = []
    for i in ids:  # runs as first-last
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return "<[" + ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges) + "]>" if ids else None


def _grammar(format: str, tools, parallel: bool, free: bool, grammars=None) -> str:
    call = _one_call(format, tools)
    specials = grammars.special_tokens if grammars is not None else {}
    tag = lambda t: t if t in specials else json.dumps(t)  # noqa: E731  a whole token, or text
    lark = "%llguidance {}\nTEXT: /(.|\\n)*/\n"
    if format == "generic":
        calls = {"type": "object", "required": ["tool_calls"], "additionalProperties": False,
                 "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1,
                                               **({} if parallel else {"maxItems": 1})}}}
        reply = {"type": "object", "properties": {"response": {"type": "string"}},
                 "required": ["response"], "additionalProperties": False}
        return lark + f"start: {_json({'anyOf': [calls, reply]} if free else calls)}\n"
    if format == "llama3":
        # Free text may not start with "{": a reply that does is a call (llguidance's recipe).
        start = "start: /[^{](.|\\n)*/ | calls\n" if free else "start: calls\n"
        py = f"{PYTHON_TAG}? " if PYTHON_TAG in specials else ""
        more = " (/; ?/ call)*" if parallel else ""
        return lark + start + f"calls: {py}call{more}\ncall: {_json(call)}\n"
    lark += f'body: "\\n" {_json(call)} "\\n" {tag(CLOSE)}\n'
    more = f" (/\\n?/ {tag(OPEN)} body)*" if parallel else ""
    special = _specials(grammars, (OPEN, CLOSE))
    text = f"TEXT ({special} TEXT)*" if special else "TEXT"
    if not free:  # a thinking model (Qwen3) may think first, where <think> is a token
        think = "(<think> TEXT </think> /\\s*/)? " if {"<think>", "</think>"} <= set(specials) else ""
        return lark + f"start: {think}{tag(OPEN)} body{more}\n"
    if OPEN in specials:  # free text never holds the token: the call starts there
        return lark + f"start: {text} ({OPEN} body{more})?\n"
    # Lazy: free text ends at the first "<tool_call>" written, and the call after it is constrained.
    before = f"(TEXT {special})* " if special else ""
    return lark + f"start: {text} | {before}open body{more}\nopen[lazy]: /(.|\\n)*{OPEN}/\n"


def required_grammar(format: str, tools, parallel: bool = True, grammars=None) -> str:
    """The reply is one call (if parallel, one or more) to `tools`. `grammars`, the engine's
    constrain.Grammars, says which tags are whole tokens in the vocabulary; without it, text."""
    return _grammar(format, tools, parallel, False, grammars)


def named_grammar(format: str, tool, grammars=None) -> str:
    """The reply is one call to `tool`."""
    return _grammar(format, [tool], False, False, grammars)


def auto_grammar(format: str, tools, parallel: bool = True, grammars=None) -> str:
    """Free text until the model opens a call, constrained from there: hermes at <tool_call>
    (the token, or lazily the text), llama3 at a leading `{`. A generic reply is all JSON,
    so it is constrained from the start."""
    return _grammar(format, tools, parallel, True, grammars)


def tool_choice_grammar(format: str, tools, tool_choice="auto", parallel: bool = True,
                        grammars=None) -> str | None:
    """The grammar for a request's tool_choice: None for "none", or without tools."""
    if not tools or tool_choice == "none":
        return None
    if tool_choice in ("auto", "required"):
        return _grammar(format, tools, parallel, tool_choice == "auto", grammars)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    for f in functions(tools):
        if f["name"] == name:
            return named_grammar(format, f, grammars)
    raise InfernoError(f"tool_choice names {name!r}, which is not in tools", params=("tool_choice",))
