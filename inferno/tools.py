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


# -- a call object read as it streams --------------------------------------------------------------
class _Incomplete(Exception):
    """The text ends inside what is being read."""


class _Invalid(Exception):
    """The text cannot be a call object."""


_LITERAL = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null")
_SPACE = " \t\n\r"


def _skip_ws(s: str, i: int, end: int) -> int:
    while i < end and s[i] in _SPACE:
        i += 1
    return i


def _string_end(s: str, i: int, end: int) -> int:
    """The index past the JSON string that opens at s[i]."""
    j = i + 1
    while j < end:
        if s[j] == "\\":
            j += 2
        elif s[j] == '"':
            return j + 1
        else:
            j += 1
    raise _Incomplete


def _value_end(s: str, i: int, end: int) -> int:
    """The index past the JSON value at s[i] (objects and arrays by their brackets)."""
    if i >= end:
        raise _Incomplete
    if s[i] == '"':
        return _string_end(s, i, end)
    if s[i] in "{[":
        depth, j = 0, i
        while j < end:
            c = s[j]
            if c == '"':
                j = _string_end(s, j, end)
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        raise _Incomplete
    m = _LITERAL.match(s, i, end)
    if not m:
        raise _Invalid
    if m.end() == end:  # a number may go on
        raise _Incomplete
    return m.end()


@dataclass
class _Scan:
    """What a call object holds so far: its name (once its string is whole), where its
    arguments' value starts and ends, where the object ends; `invalid`: it cannot be a call."""
    name: str | None = None
    args: int | None = None
    args_end: int | None = None
    end: int | None = None
    invalid: bool = False


def _scan_call(s: str, i: int, end: int) -> _Scan:
    """The call object ({"name": ..., "arguments" or "parameters": ...}) opening at s[i], read
    as far as s[:end] goes."""
    out = _Scan()
    try:
        if i >= end:
            raise _Incomplete
        if s[i] != "{":
            raise _Invalid
        j = _skip_ws(s, i + 1, end)
        while True:
            if j >= end:
                raise _Incomplete
            if s[j] == "}":
                out.end = j + 1
                return out
            if s[j] != '"':
                raise _Invalid
            k = _string_end(s, j, end)
            key = json.loads(s[j:k])
            j = _skip_ws(s, k, end)
            if j >= end:
                raise _Incomplete
            if s[j] != ":":
                raise _Invalid
            j = _skip_ws(s, j + 1, end)
            if key in ("arguments", "parameters") and out.args is None:
                if j < end:
                    out.args = j
                v = _value_end(s, j, end)
                out.args_end = v
            elif key == "name" and out.name is None:
                if j < end and s[j] != '"':
                    raise _Invalid
                v = _string_end(s, j, end)
                out.name = json.loads(s[j:v])
            else:
                v = _value_end(s, j, end)
            j = _skip_ws(s, v, end)
            if j >= end:
                raise _Incomplete
            if s[j] == ",":
                j = _skip_ws(s, j + 1, end)
            elif s[j] != "}":
                raise _Invalid
    except _Incomplete:
        return out
    except (_Invalid, json.JSONDecodeError):
        out.invalid = True
        return out


@dataclass
class _Open:
    """A call being streamed: where its object starts in the text, its index among the calls,
    and how much of its arguments has gone out."""
    start: int  # the object's "{" (hermes: the first character after <tool_call>)
    index: int
    mark: int = 0  # where its text starts: its tag or separator, where a reply would be cut
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))
    named: bool = False
    sent: int | None = None  # arguments sent up to here (raw text arguments)
    done: bool = False  # its arguments are all out
    complete: bool = False  # its object is whole (in `calls`)


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


@dataclass(frozen=True)
class Call:
    """A complete call in a reply's text: its object at start..end, its text from mark (a tag
    or separator before it) on."""
    mark: int
    start: int
    end: int
    name: str
    arguments: str


class StreamParser:
    """Feed the reply's text as it is decoded; get content and tool-call deltas as they can be
    told apart. A call's id and name go out once its name is whole, then its arguments fragment
    by fragment as they are generated (OpenAI's streaming, from which instructor and others
    build partial objects); arguments the model wrote as a JSON string go out whole, decoded.
    Content that may be the start of a call is held back until it is known not to be. A reply
    cut in the middle of a call (max_tokens) still has the call, with the arguments written so
    far; a call cut before its name is whole is dropped: the wrapper never reaches content.

    `calls` lists each call as it completes: what CallGuard reads to end a reply at a
    repeated call."""

    def __init__(self, format: str):
        if format not in FORMATS:
            raise ValueError(f"unknown tool-call format {format!r}")
        self.format = format
        self.text = ""  # everything fed
        self.pos = 0  # the text before it has gone out (as content or calls)
        self.state = "start"
        self.open: _Open | None = None  # the call being read
        self.count = 0  # calls named so far
        self.calls: list[Call] = []  # the complete calls
        self.content = _Content()
        self.at = 0  # generic: where its array's next element, or its response string, is read
        self.kind = None  # generic: "tool_calls", "response" or "text", once the opening says

    def feed(self, piece: str) -> list[Delta]:
        self.text += piece
        return getattr(self, "_" + self.format)(False)

    def finish(self) -> list[Delta]:
        return getattr(self, "_" + self.format)(True)

    # -- what every format shares -----------------------------------------------------------------
    def _content_to(self, upto: int) -> list[Delta]:
        text, self.pos = self.text[self.pos:upto], max(self.pos, upto)
        return self.content.push(text)

    def _call(self, start: int, end: int, mark: int) -> tuple[list[Delta], _Scan]:
        """Read the call object at `start` as far as `end`: the deltas it makes known now (its
        id and name, then arguments), and its scan. `mark` is where its text starts (a tag,
        a separator), for `calls`."""
        if self.open is None or self.open.start != start:
            self.open = _Open(start, self.count)
        call, s = self.open, self.text
        call.mark = mark
        scan, out = _scan_call(s, start, end), []
        if not call.named and scan.name is not None:
            call.named, self.count = True, self.count + 1
            out.append(Delta(index=call.index, id=call.id, name=scan.name, arguments=""))
        if not call.named:
            return out, scan
        if call.done:
            pass
        elif scan.args is not None and s[scan.args] != '"':  # raw JSON: as it comes
            upto = scan.args_end if scan.args_end is not None else end
            start_at = scan.args if call.sent is None else call.sent
            if upto > start_at:
                out.append(Delta(index=call.index, arguments=s[start_at:upto]))
            call.sent, call.done = max(start_at, upto), scan.args_end is not None
        elif scan.args_end is not None or (scan.args is None and scan.end is not None):
            out.append(Delta(index=call.index, arguments=_arguments(s, scan)))  # whole
            call.done = True
        if call.done and scan.end is not None and not call.complete:
            call.complete = True
            self.calls.append(Call(mark, start, scan.end, scan.name, _arguments(s, scan)))
        return out, scan

    # -- the formats -------------------------------------------------------------------------------
    def _hermes(self, final: bool) -> list[Delta]:
        out, s = [], self.text
        while True:
            if self.state != "call":
                i = s.find(OPEN, self.pos)
                if i < 0:  # hold back a tail that could start <tool_call>
                    longest = min(len(OPEN) - 1, len(s) - self.pos)
                    keep = next((k for k in range(longest, 0, -1) if OPEN.startswith(s[len(s) - k:])), 0)
                    return out + self._content_to(len(s) - (0 if final else keep))
                out += self._content_to(i)
                self.state, self.at = "call", i
            # The call's body ends at </tool_call>, or where the text does.
            close = s.find(CLOSE, self.at + len(OPEN))
            body_end = close if close >= 0 else len(s)
            deltas, scan = self._call(_skip_ws(s, self.at + len(OPEN), body_end), body_end, self.at)
            out += deltas
            if close < 0 and not final:
                return out
            if not self.open.named and (close >= 0 or scan.invalid):  # not a call: it was text
                out += self.content.push(s[self.at:close + len(CLOSE) if close >= 0 else len(s)])
            self.pos = close + len(CLOSE) if close >= 0 else len(s)
            self.state, self.open = "text", None
            if close < 0:
                return out

    def _llama3(self, final: bool) -> list[Delta]:
        out, s = [], self.text
        while self.state != "text":
            if self.open is not None:  # a call in progress
                deltas, scan = self._call(self.open.start, len(s), self.at)
                out += deltas
                if scan.invalid or (scan.end is not None and not self.open.named):
                    self.open, self.state = None, "text"  # not a call: the rest is text
                    break
                if scan.end is None:
                    if not final:
                        return out
                    self.pos = len(s)  # cut: what was written is the call
                    return out
                self.pos, self.open = scan.end, None
                continue
            i = _skip_ws(s, self.pos, len(s))
            self.at = i
            if self.count:  # after a call: one ';' before the next
                if s.startswith(";", i):
                    i = _skip_ws(s, i + 1, len(s))
                elif i < len(s):
                    self.state = "text"
                    break
            elif s.startswith(PYTHON_TAG, i):
                i = _skip_ws(s, i + len(PYTHON_TAG), len(s))
            elif i < len(s) and PYTHON_TAG.startswith(s[i:]) and not final:
                return out
            if i >= len(s):
                if not final:
                    return out
                if self.count:
                    self.pos = len(s)
                self.state = "text"
                break
            if s[i] != "{":
                self.state = "text"
                break
            self.open = _Open(i, self.count)
        return out + self._content_to(len(s))

    def _generic(self, final: bool) -> list[Delta]:
        """{"tool_calls": [call, ...]} streams its calls, {"response": "..."} its text; any other
        reply is content, whole (until its opening says which, it may be either)."""
        s, out = self.text, []
        if self.state == "start":
            opening = _generic_opening(s, _skip_ws(s, 0, len(s)))
            if opening is None and not final:
                return []
            self.state, at = opening or ("text", 0)
            self.kind, self.at = self.state, at + 1
        if self.state == "text":
            return self._content_to(len(s))
        if self.kind == "response":  # read as it comes; what follows its string is nothing
            return self._response(final) if self.state == "response" else []
        while self.state == "tool_calls":  # at an element of the array, or inside one
            if self.open is None:
                i = _skip_ws(s, self.at, len(s))
                if self.count and s.startswith(",", i):
                    i = _skip_ws(s, i + 1, len(s))
                if i >= len(s):
                    break
                if s[i] != "{":  # "]", or anything else: the array is over
                    self.state = "over"
                    break
                self.open = _Open(i, self.count)
                self.mark = self.at if self.count else i  # a repeat is cut at its comma
            deltas, scan = self._call(self.open.start, len(s), self.mark)
            out += deltas
            if scan.invalid or (scan.end is not None and not self.open.named):
                self.state, self.open = "over", None
                break
            if scan.end is None:
                break
            self.at, self.open = scan.end, None
        if final:
            if not self.count and self.state == "over":  # no call after all: the reply is text
                self.state = "text"
                return out + self._content_to(len(s))
            self.pos = len(s)  # (cut before a call had its name: the wrapper is not content)
        return out

    def _response(self, final: bool) -> list[Delta]:
        """The response string's characters as content, decoded as they come (a partial escape
        held back)."""
        s, j, text = self.text, self.at, []
        while j < len(s) and s[j] != '"':
            if s[j] != "\\":
                text.append(s[j])
                j += 1
                continue
            m = _ESCAPE.match(s, j)
            if m is None:
                if len(s) - j < 6 and not final:
                    break  # an escape not yet whole
                self.state = "over"  # not JSON: what came before stays
                break
            text.append(json.loads(f'"{m.group(0)}"'))
            j = m.end()
        self.at = j
        if j < len(s) and s[j] == '"':
            self.state = "over"
        self.pos = len(s)
        return self.content.push("".join(text))


_ESCAPE = re.compile(r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})')


def _arguments(s: str, scan: _Scan) -> str:
    """A complete call's arguments as JSON text: the model's own text of the object (re-serialised,
    1e999 would become Infinity), a string's decoded text, or "{}" when there are none."""
    if scan.args is None or scan.args_end is None:
        return "{}" if scan.args is None else s[scan.args:]
    raw = s[scan.args:scan.args_end]
    if raw.startswith('"'):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def _generic_opening(s: str, i: int):
    """How a generic reply opening at s[i] reads: ("tool_calls", index of its "["),
    ("response", index of its string's quote), ("text", 0) when it is neither, or None while
    the text does not say yet."""
    n = len(s)
    if i >= n:
        return None
    if s[i] != "{":
        return ("text", 0)
    j = _skip_ws(s, i + 1, n)
    if j >= n:
        return None
    if s[j] != '"':
        return ("text", 0)
    k = j + 1
    while k < n and s[k] not in '"\\':
        k += 1
    key = s[j + 1:k]
    if not any(w.startswith(key) for w in ("tool_calls", "response")):
        return ("text", 0)
    if k >= n:
        return None
    if s[k] != '"' or key not in ("tool_calls", "response"):
        return ("text", 0)
    j = _skip_ws(s, k + 1, n)
    if j < n and s[j] == ":":
        j = _skip_ws(s, j + 1, n)
    elif j < n:
        return ("text", 0)
    if j >= n:
        return None
    return (key, j) if s[j] == ("[" if key == "tool_calls" else '"') else ("text", 0)


# Most calls one reply may hold when parallel calls are allowed: a small model can repeat itself.
MAX_CALLS = 16


class CallGuard:
    """Ends a reply whose calls repeat: a call identical to an earlier one (the same name and
    arguments, written with any whitespace), or one call too many (MAX_CALLS), and the reply is
    cut where that call starts, as a stop string cuts it. Small models repeat their last call until max_tokens
    (SmolLM2 does); agent frameworks leave parallel calls on (OpenAI's default). The generation
    loop feeds it the reply's text and holds back, unsent, what it says may still be cut: the
    text after the last call while the next could be a repeat, and a call while it is written
    exactly as an earlier one was (so every other call's arguments still stream as written)."""

    def __init__(self, format: str):
        self.parser = StreamParser(format)

    def feed(self, piece: str) -> None:
        self.parser.feed(piece)

    def cut(self) -> int | None:
        """Where the reply ends, if it must: the start of a repeated call, or of one too many."""
        p, calls = self.parser, self.parser.calls
        for k, c in enumerate(calls):
            if k >= MAX_CALLS or any(self._body(e) == self._body(c) for e in calls[:k]):
                return c.mark
        if p.open is not None and not p.open.complete and len(calls) >= MAX_CALLS:
            return p.open.mark
        return None

    def hold(self) -> int:
        """Where the text that may still be cut starts (its length: none)."""
        p, s = self.parser, self.parser.text
        if not p.calls:
            return len(s)
        if p.open is not None and not p.open.complete:
            so_far = _squeeze(s[p.open.start:])
            may_repeat = any(self._body(c).startswith(so_far) for c in p.calls)
            return p.open.mark if may_repeat else len(s)
        after = p.calls[-1].end
        tail = s[after:].strip(" \t\n\r")
        if p.format == "hermes":
            more = OPEN.startswith(tail[:len(OPEN)]) or tail.startswith(CLOSE) and OPEN.startswith(
                tail[len(CLOSE):].strip(" \t\n\r")[:len(OPEN)])
        elif p.format == "llama3":
            more = p.state != "text" and (not tail or tail.startswith(";"))
        else:
            more = p.state == "tool_calls" and (not tail or tail.startswith(","))
        return after if more else len(s)

    def _body(self, call: Call) -> str:
        return _squeeze(self.parser.text[call.start:call.end])


def _squeeze(json_text: str) -> str:
    """JSON text (or the start of it) without the whitespace between its tokens."""
    out, i, n = [], 0, len(json_text)
    while i < n:
        c = json_text[i]
        if c == '"':
            try:
                j = _string_end(json_text, i, n)
            except _Incomplete:
                j = n
            out.append(json_text[i:j])
            i = j
        else:
            if c not in _SPACE:
                out.append(c)
            i += 1
    return "".join(out)


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
