"""Tool calls (OpenAI `tools`): the format a model's chat template speaks, the calls parsed out of
its reply (whole, or as it streams), and grammars that constrain them.

Formats, chosen from the template (llama.cpp's common/chat.cpp does the same):
- hermes (Qwen2.5, Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, any
  number, after optional text.
- llama3 (Llama 3.1+): the reply is `{"name": ..., "parameters": {...}}`, optionally after
  `<|python_tag|>`, several separated by `;`.
- generic (templates without tools; `generic_system_prompt` teaches it): the reply is one JSON
  object, `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"response": "..."}`.
- harmony (gpt-oss): OpenAI's harmony format, harmony.py's: the reply's channels are reasoning,
  content and calls (tags that are special tokens, kept in the text for its parser); one call
  ends the reply (<|call|>). Its parser, grammars and guard are chosen here (stream_parser,
  tool_choice_grammar, call_guard), so a caller never asks which format it has.
A call that does not parse stays in the content as text. Arguments are JSON text, as OpenAI
sends them: the model's own text of the object, so the streamed fragments and the whole reply
give the same string.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from inferno.calls import Delta, ToolCall, collect, functions, json_rule as _json
from inferno.errors import InfernoError

FORMATS = ("hermes", "llama3", "generic")  # this module's parser's (StreamParser)
HARMONY = "harmony"  # harmony.py's: any format a model speaks is one of FORMATS or this
OPEN, CLOSE, PYTHON_TAG = "<tool_call>", "</tool_call>", "<|python_tag|>"
# Formats whose tags are special tokens that a reply's text must keep (decoded with them) for its
# parser, which strips them: none of them reaches a client.
TAGGED = (HARMONY,)


def detect_format(chat_template: str | None) -> str:
    from inferno.harmony import is_harmony
    t = chat_template or ""
    if is_harmony(t):
        return HARMONY
    if OPEN in t:
        return "hermes"
    if PYTHON_TAG in t or ("ipython" in t and "parameters" in t):  # Llama 3.1 / 3.2 / 3.3
        return "llama3"
    return "generic"


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
def parse(format: str, text: str) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply: the streamed deltas, collected."""
    _, content, calls = parse_reply(format, text)
    return content, calls


def parse_reply(format: str | None, text: str, think: str | None = None) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, calls) of a whole reply in `format`: its streamed deltas (those of
    stream_parser), collected. Reasoning is harmony's (its analysis), or a think block's where
    `think` says the reply may open one (thinking.py); "" otherwise."""
    p = stream_parser(format, think)
    return collect(p.feed(text) + p.finish())


def stream_parser(format: str | None, think: str | None = None):
    """A reply's streamed parser for `format` (None: no tool calls, only with `think`):
    feed(text) and finish() give Deltas, with `reasoning` for harmony's analysis and, where
    `think` (thinking.TAGS or OPENED) says the reply may reason in a think block, for that."""
    if format == HARMONY:
        from inferno.harmony import StreamParser as HarmonyParser
        return HarmonyParser()
    inner = StreamParser(format) if format is not None else None
    if think is None:
        if inner is None:
            raise ValueError("a reply's parser needs a tool-call format or a think mode")
        return inner
    from inferno.thinking import ThinkSplit
    return ThinkSplit(think, inner)


def call_guard(format: str | None) -> "CallGuard | None":
    """What ends a reply in `format` whose calls repeat (CallGuard); None without a format, and
    for harmony, whose reply ends at its one call."""
    return CallGuard(format) if format and format != HARMONY else None


# -- a call object read as it streams --------------------------------------------------------------
_LITERAL = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null")
_SPACE = " \t\n\r"


def _skip_ws(s: str, i: int, end: int) -> int:
    while i < end and s[i] in _SPACE:
        i += 1
    return i


def _string_ends(reader, c: str) -> bool:
    """One character `c` inside a JSON string for a reader that keeps `in_string` and
    `escape`: whether it closes the string."""
    if reader.escape:
        reader.escape = False
    elif c == "\\":
        reader.escape = True
    elif c == '"':
        reader.in_string = False
        return True
    return False


class _Reader:
    """A call object ({"name": ..., "arguments" or "parameters": ...}) read as its text grows:
    each character once, the reading resumed where the last feed stopped. What it has found:
    the name (once its string is whole), where the arguments' value starts and ends, where the
    object ends; `invalid`: the text cannot be a call; `cut_at`: where a `close` tag outside
    any string ended the text before the object did (hermes' </tool_call>)."""

    def __init__(self, start: int, close: str | None = None):
        self.i, self.close = start, close
        self.mode = "open"  # open, key, colon, value, after
        self.token: int | None = None  # where the key or value being read starts
        self.depth = 0  # brackets open inside the value
        self.in_string = self.escape = False
        self.key: str | None = None
        self.name: str | None = None
        self.args: int | None = None
        self.args_end: int | None = None
        self.end: int | None = None
        self.invalid = False
        self.cut_at: int | None = None

    @property
    def done(self) -> bool:
        return self.end is not None or self.invalid or self.cut_at is not None

    def read(self, s: str, end: int) -> None:
        """Read on as far as s[:end]; a tag that may be `close` at the end waits for the rest."""
        i = self.i
        while i < end and not self.done:
            c = s[i]
            if self.in_string:  # a key's or a value's string: only its end matters
                if _string_ends(self, c) and self.depth == 0:
                    self._token_done(s, i + 1)
                i += 1
                continue
            if self.close and c == self.close[0] and self.close.startswith(s[i:i + len(self.close)]):
                if s.startswith(self.close, i):
                    self.cut_at = i
                break  # the tag, or perhaps the tag: wait for the rest
            if self.mode == "value" and self.token is not None:  # inside a value
                if c == '"':
                    self.in_string = True
                elif c in "{[":
                    self.depth += 1
                elif c in "}]" and self.depth:
                    self.depth -= 1
                    if self.depth == 0:
                        self._token_done(s, i + 1)
                elif self.depth == 0 and (c in _SPACE or c in ",}"):
                    self._literal_done(s, i)
                    continue  # the delimiter is read again, as what follows the value
                i += 1
                continue
            if c in _SPACE:
                i += 1
                continue
            if self.mode == "open":
                self.mode, self.invalid = "key", c != "{"
            elif self.mode == "key":
                if c == "}":
                    self.end = i + 1
                elif c == '"':
                    self.token, self.in_string = i, True
                else:
                    self.invalid = True
            elif self.mode == "colon":
                self.mode, self.invalid = "value", c != ":"
            elif self.mode == "value":  # a value starts
                self.token = i
                if self.key in ("arguments", "parameters") and self.args is None:
                    self.args = i
                if self.key == "name" and self.name is None and c != '"':
                    self.invalid = True
                elif c == '"':
                    self.in_string = True
                elif c in "{[":
                    self.depth = 1
                elif not (c == "-" or c.isdigit() or c in "tfn"):
                    self.invalid = True
            elif self.mode == "after":
                if c == "}":
                    self.end = i + 1
                elif c == ",":
                    self.mode = "key"
                else:
                    self.invalid = True
            i += 1
        self.i = i

    def _literal_done(self, s: str, i: int) -> None:
        if _LITERAL.fullmatch(s, self.token, i):
            self._token_done(s, i)
        else:
            self.invalid = True

    def _token_done(self, s: str, end: int) -> None:
        """The key or the value that started at `token` ends at `end`."""
        start, self.token = self.token, None
        if self.mode == "key":
            self.key, self.mode = json.loads(s[start:end]), "colon"
            return
        if self.key == "name" and self.name is None:
            self.name = json.loads(s[start:end])
        elif start == self.args and self.args_end is None:
            self.args_end = end
        self.mode, self.key = "after", None


@dataclass
class _Open:
    """A call being streamed: its reader, its index among the calls, where its text starts
    (its tag or separator: where a reply would be cut), and how much of its arguments is out."""
    reader: _Reader
    start: int  # where its object's reading starts (hermes: right after <tool_call>)
    index: int
    mark: int
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))
    named: bool = False
    sent: int | None = None  # raw arguments sent up to here
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
    Each character is read once (a call's _Reader resumes where the last piece ended).

    `calls` lists each call as it completes: what CallGuard reads to end a reply at a
    repeated call."""

    def __init__(self, format: str):
        if format not in FORMATS:  # (harmony's parser is harmony.py's: stream_parser)
            raise ValueError(f"unknown tool-call format {format!r}")
        self.format = format
        self.text = ""  # everything fed
        self.pos = 0  # the text before it has gone out (as content or calls)
        self.state = "start"
        self.open: _Open | None = None  # the call being read
        self.count = 0  # calls named so far
        self.calls: list[Call] = []  # the complete calls
        self.content = _Content()
        self.at = 0  # where the current call's text starts; generic: where its array is read
        self.kind = None  # generic: "tool_calls", "response" or "text", once the opening says
        self.high = ""  # generic: a response's high surrogate escape, waiting for its pair

    def feed(self, piece: str) -> list[Delta]:
        self.text += piece
        return getattr(self, "_" + self.format)(False)

    def finish(self) -> list[Delta]:
        return getattr(self, "_" + self.format)(True)

    # -- what every format shares -----------------------------------------------------------------
    def _content_to(self, upto: int) -> list[Delta]:
        text, self.pos = self.text[self.pos:upto], max(self.pos, upto)
        return self.content.push(text)

    def _call(self, start: int, end: int, mark: int, close: str | None = None) -> list[Delta]:
        """Read on the call object at `start` as far as `end`: the deltas it makes known now
        (its id and name, then arguments). `mark` is where its text starts, for `calls`."""
        if self.open is None or self.open.start != start:
            self.open = _Open(_Reader(start, close), start, self.count, mark)
        call, s = self.open, self.text
        rd, out = call.reader, []
        rd.read(s, end)
        if not call.named and rd.name is not None:
            call.named, self.count = True, self.count + 1
            out.append(Delta(index=call.index, id=call.id, name=rd.name, arguments=""))
        if not call.named or call.done:
            pass
        elif rd.args is not None and s[rd.args] != '"':  # raw JSON: as it comes
            upto = rd.args_end if rd.args_end is not None else (rd.cut_at if rd.cut_at is not None else rd.i)
            from_ = rd.args if call.sent is None else call.sent
            if upto > from_:
                out.append(Delta(index=call.index, arguments=s[from_:upto].rstrip(_SPACE) if rd.cut_at else s[from_:upto]))
            call.sent, call.done = max(from_, upto), rd.args_end is not None
        elif rd.args_end is not None or (rd.args is None and rd.end is not None):
            out.append(Delta(index=call.index, arguments=_arguments(s, rd)))  # whole
            call.done = True
        if call.done and rd.end is not None and not call.complete:
            call.complete = True
            self.calls.append(Call(mark, start, rd.end, rd.name, _arguments(s, rd)))
        return out

    # -- the formats -------------------------------------------------------------------------------
    def _hermes(self, final: bool) -> list[Delta]:
        out, s = [], self.text
        while True:
            if self.state != "call":
                i = s.find(OPEN, self.pos)
                if i < 0:  # hold back a tail that could start <tool_call>
                    keep = 0 if final else _tag_tail(s, self.pos, OPEN)
                    return out + self._content_to(len(s) - keep)
                out += self._content_to(i)
                self.state, self.at = "call", i
            out += self._call(self.at + len(OPEN), len(s), self.at, CLOSE)
            call, rd = self.open, self.open.reader
            if rd.end is not None:  # the object is whole: then whitespace and </tool_call>
                j = _skip_ws(s, rd.end, len(s))
                if s.startswith(CLOSE, j):
                    after = j + len(CLOSE)
                elif j < len(s) and not CLOSE.startswith(s[j:j + len(CLOSE)]):
                    after = j  # no closing tag: what follows is text
                elif final:
                    after = len(s)
                else:
                    return out
            elif rd.cut_at is not None:  # </tool_call> before the object ended
                after = rd.cut_at + len(CLOSE)
            elif rd.invalid:
                close = s.find(CLOSE, rd.i)
                if close < 0 and not final:
                    return out
                after = close + len(CLOSE) if close >= 0 else len(s)
            elif final:
                after = len(s)  # cut inside the call
            else:
                return out
            if not call.named and rd.done:  # not a call, as it turned out: text
                out += self.content.push(s[self.at:after])
            self.pos, self.state, self.open = after, "text", None
            if final and after >= len(s):
                return out

    def _llama3(self, final: bool) -> list[Delta]:
        out, s = [], self.text
        while self.state != "text":
            if self.open is not None:  # a call in progress
                out += self._call(self.open.start, len(s), self.at)
                call, rd = self.open, self.open.reader
                if rd.invalid or (rd.end is not None and not call.named):
                    self.open, self.state = None, "text"  # not a call: the rest is text
                    if call.named:  # (a named call went out: its own text is not content)
                        self.pos = len(s)
                    break
                if rd.end is None:
                    if not final:
                        return out
                    self.pos = len(s)  # cut: what was written is the call
                    return out
                self.pos, self.open = rd.end, None
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
            self.open = _Open(_Reader(i), i, self.count, self.at)
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
                mark = i
                if self.count and s.startswith(",", i):
                    i = _skip_ws(s, i + 1, len(s))
                if i >= len(s):
                    break
                if s[i] != "{":  # "]", or anything else: the array is over
                    self.state = "over"
                    break
                self.open = _Open(_Reader(i), i, self.count, mark if self.count else i)
            out += self._call(self.open.start, len(s), self.open.mark)
            call, rd = self.open, self.open.reader
            if rd.invalid or (rd.end is not None and not call.named):
                self.state, self.open = "over", None
                break
            if rd.end is None:
                break
            self.at, self.open = rd.end, None
        if final:
            if not self.count and self.state == "over":  # no call after all: the reply is text
                self.state = "text"
                return out + self._content_to(len(s))
            self.pos = len(s)  # (cut before a call had its name: the wrapper is not content)
        return out

    def _response(self, final: bool) -> list[Delta]:
        """The response string's characters as content, decoded as they come: an escape not yet
        whole, or a high surrogate waiting for its pair, is held back; a lone surrogate is
        U+FFFD, as a decoder replaces what is not text."""
        s, j, text = self.text, self.at, []
        while j < len(s) and s[j] != '"':
            if s[j] != "\\":
                text.append(s[j])
                j += 1
                continue
            m = _ESCAPE.match(s, j)
            if m is None:
                if len(s) - j < 12 and not final:
                    break  # an escape, or a surrogate pair, not yet whole
                self.state = "over"  # not JSON: what came before stays
                break
            esc = m.group(0)
            if _HIGH.fullmatch(esc) and j + 12 > len(s) and not final:
                break  # its low half may follow
            text.append(_unescape(esc))
            j = m.end()
        self.at = j
        if j < len(s) and s[j] == '"':
            self.state = "over"
        self.pos = len(s)
        return self.content.push("".join(text))


# One JSON escape, a surrogate pair whole: \uD83D\uDE00 is one character.
_ESCAPE = re.compile(r'\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|["\\/bfnrt]|u[0-9a-fA-F]{4})')
_HIGH = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")


def _unescape(escape: str) -> str:
    """One JSON escape's text; a lone surrogate (not text) is U+FFFD."""
    text = json.loads(f'"{escape}"')
    return "\ufffd" if len(text) == 1 and 0xD800 <= ord(text) <= 0xDFFF else text


def _tag_tail(s: str, start: int, tag: str) -> int:
    """The length of the longest end of s[start:] that could begin `tag`."""
    longest = min(len(tag) - 1, len(s) - start)
    return next((k for k in range(longest, 0, -1) if tag.startswith(s[len(s) - k:])), 0)


def _arguments(s: str, rd: _Reader) -> str:
    """A call's arguments as JSON text: the model's own text of the object (re-serialised,
    1e999 would become Infinity), a string's decoded text, "{}" when there are none; for a cut
    call, what was written."""
    if rd.args is None:
        return "{}"
    end = rd.args_end if rd.args_end is not None else (rd.cut_at if rd.cut_at is not None else rd.i)
    raw = s[rd.args:end]
    if raw.startswith('"') and rd.args_end is not None:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw if rd.args_end is not None else raw.rstrip(_SPACE)


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
    arguments, written with any whitespace between their tokens), or one call too many
    (MAX_CALLS), and the reply is cut where that call starts, as a stop string cuts it. Small
    models repeat their last call until max_tokens (SmolLM2 does); agent frameworks leave
    parallel calls on (OpenAI's default). The generation loop feeds it the reply's text and
    holds back, unsent, what it says may still be cut: after a call, what could begin the next
    one, and a call while it is written exactly as an earlier one was (so every other call's
    arguments still stream as written). Repeats are found by their text: {"x": 1.0} and
    {"x": 1} are two calls."""

    def __init__(self, format: str):
        self.parser = StreamParser(format)
        self.bodies: list[str] = []  # each complete call's object, squeezed
        self.open = _Squeezed()  # the open call's object so far, squeezed

    def feed(self, piece: str) -> None:
        p = self.parser
        p.feed(piece)
        for c in p.calls[len(self.bodies):]:
            self.bodies.append(_Squeezed().read(p.text, c.start, c.end))
        if p.open is not None and not p.open.complete:
            if self.open.start != p.open.start:
                self.open = _Squeezed()
            self.open.read(p.text, p.open.start, len(p.text))

    def cut(self) -> int | None:
        """Where the reply ends, if it must: the start of a repeated call, or of one too many."""
        p, calls = self.parser, self.parser.calls
        for k, c in enumerate(calls):
            if k >= MAX_CALLS or self.bodies[k] in self.bodies[:k]:
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
            so_far = self.open.text
            return p.open.mark if any(b.startswith(so_far) for b in self.bodies) else len(s)
        after = p.calls[-1].end
        tail = s[after:].strip(_SPACE)
        if p.format == "hermes":
            if tail.startswith(CLOSE):
                tail = tail[len(CLOSE):].lstrip(_SPACE)
            # a tag may still open anywhere in text: hold back what could begin one
            return after if OPEN.startswith(tail[:len(OPEN)]) else len(s) - _tag_tail(s, after, OPEN)
        if p.format == "llama3":
            more = p.state != "text" and (not tail or tail.startswith(";"))
        else:
            more = p.state == "tool_calls" and (not tail or tail.startswith(","))
        return after if more else len(s)


class _Squeezed:
    """JSON text read from `start` without the whitespace between its tokens, extended as the
    text grows (each character once)."""

    def __init__(self):
        self.start, self.i, self.parts = None, 0, []
        self.in_string = self.escape = False

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def read(self, s: str, start: int, end: int) -> str:
        if self.start is None:
            self.start, self.i = start, start
        for c in s[self.i:end]:
            if self.in_string:
                self.parts.append(c)
                _string_ends(self, c)
            elif c not in _SPACE:
                self.parts.append(c)
                self.in_string = c == '"'
        self.i = max(self.i, end)
        return self.text


# -- grammars (llguidance Lark, for constrain.Grammars.compile(lark=...)) -------------------------
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
    if format == HARMONY:
        from inferno.harmony import tool_choice_grammar as harmony_grammar
        return harmony_grammar(tools, tool_choice, parallel, grammars)
    if not tools or tool_choice == "none":
        return None
    if tool_choice in ("auto", "required"):
        return _grammar(format, tools, parallel, tool_choice == "auto", grammars)
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    for f in functions(tools):
        if f["name"] == name:
            return named_grammar(format, f, grammars)
    raise InfernoError(f"tool_choice names {name!r}, which is not in tools", params=("tool_choice",))
