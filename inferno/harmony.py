"""OpenAI's harmony format, gpt-oss's chat format: the prompt rendered from chat-completions
messages, the reply parsed back into reasoning, content and tool calls (whole, or as it
streams), and grammars for tool_choice.

The format (openai-harmony's docs/format.md; the bytes are the openai-harmony renderer's,
tests/test_harmony.py checks them against it): messages are `<|start|>{header}<|message|>
{content}<|end|>`, the header a role (or a tool's name), perhaps ` to={recipient}`, perhaps
`<|channel|>{channel}` and a content type (` json`, ` <|constrain|>json`). The prompt is a system
message (identity, knowledge cutoff, date, `Reasoning: low|medium|high`, the valid channels), a
developer message (`# Instructions`, the user's system prompt; `# Tools`, the functions as a
TypeScript namespace), the history, and `<|start|>assistant`. The reply goes on from there: any
number of messages, reasoning on the analysis channel, the answer on final (ended by
<|return|>), a call as `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
{...}` (ended by <|call|>); the header may also put ` to=...` before `<|channel|>`.

How the server uses it, where the model's template speaks harmony (`is_harmony(template)`):
- prompt: `render(messages, tools, reasoning_effort=req.reasoning_effort)` instead of the chat
  template (the messages as OpenAI sends them: `reasoning_content` on assistant turns, tool
  calls, `tool` results), then `tokenizer.encode(text, add_special_tokens=False)`: the tags are
  gpt-oss's special tokens. Generation stops at <|return|> and <|call|> (STOPS: both must be
  end tokens of the model; gpt-oss's generation_config lists them).
- the reply's text must keep the special tokens (decode with skip_special_tokens=False): a
  stop token at its end may be there or not.
- streamed: one `StreamParser()` per choice, `feed(text)` each piece and `finish()` at the end;
  each Delta (calls.Delta) is reasoning, content or a call's: send `reasoning` as
  `delta.reasoning_content`, `content` as `delta.content`, a call's deltas as tools.py's (id and
  name first, then argument fragments). finish_reason "tool_calls" when `parser.count` (a call was named).
- whole: `parse(text)` -> Reply(reasoning, content, calls).
- tool_choice: `tool_choice_grammar(tools, choice, grammars=engine_grammars)`, compiled with
  Grammars.compile(lark=...), as tools.py's; None without tools ("none" holds the reply to
  reasoning and an answer).

Choices made here (documented where the format leaves them open):
- commentary text without a recipient (a "preamble" before calls) is content: it is meant for
  the user. Rendered back, an assistant turn's content beside its tool_calls is that preamble.
- several messages of one kind in one reply join with a blank line ("\\n\\n").
- a recipient `functions.NAME` is a call to NAME; any other recipient (the built-in browser and
  python tools, which the server does not run) is reasoning: the model's own action.
- reasoning in history: an assistant turn's reasoning is dropped once a later assistant turn
  answered (a message without tool_calls), and kept across the tool calls of the turn still
  going on (gpt-oss's chat template's rule). openai-harmony's auto_drop_analysis keeps more: it
  drops only the analysis before the first final, and only when the last assistant message is a
  final one.
- a function without parameters, or whose parameters have no properties, is `() => any` (the
  format's docs; openai-harmony prints `(_: {\\n})` for an empty object schema).
- arguments: a string is sent as written; an object as compact JSON, as the model writes it.
- text with no harmony tags at all (a model that does not speak it) is content, whole at finish.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import date as Date
from datetime import datetime

from inferno.calls import Delta, ToolCall, collect, functions, json_rule
from inferno.errors import InfernoError

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
TAGS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
STOPS = (RETURN, CALL)  # a reply ends at either: the answer is done, or a tool is called
MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
KNOWLEDGE_CUTOFF = "2024-06"
EFFORTS = ("low", "medium", "high")
NAMESPACE = "functions"


def is_harmony(chat_template: str | None) -> bool:
    """Whether a chat template speaks harmony (gpt-oss's)."""
    t = chat_template or ""
    return CHANNEL in t and START in t and MESSAGE in t


# -- rendering --------------------------------------------------------------------------------------
def render(messages: list[dict], tools=None, *, reasoning_effort: str | None = None,
           date: str | Date | None = None, model_identity: str = MODEL_IDENTITY,
           knowledge_cutoff: str = KNOWLEDGE_CUTOFF) -> str:
    """The prompt for OpenAI chat-completions `messages` (system, developer, user, assistant with
    `reasoning_content` and `tool_calls`, tool) and function `tools`, ending with
    `<|start|>assistant` for the reply. `date`: the current date (today where None), as
    YYYY-MM-DD; `reasoning_effort`: low, medium (None) or high."""
    fns = functions(tools)
    effort = _effort(reasoning_effort)
    if date is None:
        date = datetime.now()
    day = date if isinstance(date, str) else date.strftime("%Y-%m-%d")
    system = "\n\n".join([
        f"{model_identity}\nKnowledge cutoff: {knowledge_cutoff}\nCurrent date: {day}",
        f"Reasoning: {effort}",
        "# Valid channels: analysis, commentary, final. Channel must be included for every message."
        + ("\nCalls to these tools must go to the commentary channel: 'functions'." if fns else "")])
    out = [_message("system", system)]
    instructions = "\n\n".join(t for m in messages if m.get("role") in ("system", "developer")
                               for t in [_text(m.get("content"))] if t)
    developer = (["# Instructions", instructions] if instructions else []) + ([tools_section(fns)] if fns else [])
    if developer:
        out.append(_message("developer", "\n\n".join(developer)))
    names: dict[str, str] = {}  # call id -> function name
    last_call = None
    for i, m in enumerate(messages):
        role = m.get("role")
        if role in ("system", "developer"):
            continue
        if role == "user":
            out.append(_message("user", _text(m.get("content"))))
        elif role == "assistant":
            content, calls = _text(m.get("content")), m.get("tool_calls") or []
            if not calls:
                out.append(_message("assistant", content, channel="final"))
                continue
            answered = any(n.get("role") == "assistant" and not n.get("tool_calls") for n in messages[i + 1:])
            reasoning = _reasoning(m)
            if reasoning and not answered:
                out.append(_message("assistant", reasoning, channel="analysis"))
            if content:  # a preamble
                out.append(_message("assistant", content, channel="commentary"))
            for c in calls:
                fn = c.get("function", c)
                name = fn.get("name")
                if not isinstance(name, str) or not name:
                    raise InfernoError("each tool call in messages needs a function name", params=("messages",))
                if c.get("id"):
                    names[c["id"]] = name
                last_call = name
                out.append(_message("assistant", _arguments_text(fn.get("arguments")), channel="commentary",
                                    recipient=f"{NAMESPACE}.{name}", content_type=f"{CONSTRAIN}json"))
        elif role == "tool":
            # the call it answers: by id, else by the name given, else the turn's last call
            name = names.get(m.get("tool_call_id") or "") or m.get("name") or last_call
            if not name:
                raise InfernoError("a tool message must answer an assistant's tool call", params=("messages",))
            out.append(_message(f"{NAMESPACE}.{name}", _text(m.get("content")), channel="commentary",
                                recipient="assistant"))
        else:
            raise InfernoError(f"unknown message role {role!r}", params=("messages",))
    return "".join(out) + START + "assistant"


def _effort(effort: str | None) -> str:
    if effort is None:
        return "medium"
    e = str(effort).lower()
    if e == "minimal":  # OpenAI's lowest, which gpt-oss does not have
        return "low"
    if e not in EFFORTS:
        raise InfernoError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, not {effort!r}",
                           params=("reasoning_effort",))
    return e


def _message(author: str, content: str, *, channel: str | None = None, recipient: str | None = None,
             content_type: str | None = None) -> str:
    """One message as openai-harmony renders it: author, ` to=recipient`, channel, content type."""
    head = author + (f" to={recipient}" if recipient else "") + (f"{CHANNEL}{channel}" if channel else "")
    if content_type:
        head += " " + content_type
    end = CALL if author == "assistant" and recipient else END
    return f"{START}{head}{MESSAGE}{content}{end}"


def _text(content) -> str:
    """A message's content as text: a string, or OpenAI's list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _reasoning(m: dict) -> str:
    for key in ("reasoning_content", "reasoning", "thinking"):  # vLLM's, OpenRouter's, the template's
        if isinstance(m.get(key), str) and m[key]:
            return m[key]
    return ""


def _arguments_text(arguments) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def tools_section(fns: list[dict]) -> str:
    """The developer message's `# Tools` section for functions (calls.functions' shape)."""
    lines = [f"## {NAMESPACE}\n", f"namespace {NAMESPACE} {{\n"]
    for f in fns:
        lines += [f"// {line}" for line in _lines(f.get("description") or "")]
        params = f.get("parameters")
        if _no_arguments(params):
            lines.append(f"type {f['name']} = () => any;\n")
        else:
            lines.append(f"type {f['name']} = (_: {typescript(params)}) => any;\n")
    lines.append(f"}} // namespace {NAMESPACE}")
    return "# Tools\n\n" + "\n".join(lines)


def _no_arguments(params) -> bool:
    return (not params or (isinstance(params, dict) and params.get("type") == "object"
                           and not params.get("properties") and "oneOf" not in params))


def _lines(text: str) -> list[str]:
    """Rust's str::lines: split at \\n, a trailing \\r dropped, no empty last line."""
    parts = text.split("\n")
    if parts and parts[-1] == "":
        parts.pop()
    return [p[:-1] if p.endswith("\r") else p for p in parts]


def _json_text(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _is_enum(schema) -> bool:
    return isinstance(schema, dict) and isinstance(schema.get("enum"), list) and bool(schema["enum"])


def _default(schema: dict) -> str:
    """A default as the renderer comments it: a string quoted, unless the schema is an enum."""
    d = schema["default"]
    if isinstance(d, str):
        return f'default: {d}' if _is_enum(schema) else f'default: "{d}"'
    return f"default: {_json_text(d)}"


def _nullable(schema, text: str) -> str:
    if isinstance(schema, dict) and schema.get("nullable") is True and "null" not in text:
        return f"{text} | null"
    return text


def typescript(schema, indent: str = "") -> str:
    """A JSON Schema as the TypeScript-like type harmony prompts with (openai-harmony's
    json_schema_to_typescript, rule for rule)."""
    if not isinstance(schema, dict):
        return "any"
    one_of = schema.get("oneOf")
    if one_of is not None and isinstance(one_of, list):
        out = ""
        for k, variant in enumerate(one_of):
            out += f"\n{indent} | "
            out += _nullable(variant, typescript(variant, indent + "   "))
            comments = []
            if isinstance(variant, dict):
                if isinstance(variant.get("description"), str):
                    comments.append(variant["description"])
                if "default" in variant:
                    comments.append(_default(variant))
            if comments:
                out += " // " + " ".join(comments)
        return out
    ty = schema.get("type")
    if isinstance(ty, list):
        names = ["number" if t == "integer" else t for t in ty if isinstance(t, str)]
        if names:
            return " | ".join(names)
    if not isinstance(ty, str):
        return "any"
    if ty == "object":
        return _object(schema, indent)
    if ty == "string":
        values = [f'"{v}"' for v in schema.get("enum") or [] if isinstance(v, str)] \
            if isinstance(schema.get("enum"), list) else []
        return " | ".join(values) if values else "string"
    if ty in ("number", "integer"):
        return "number"
    if ty == "boolean":
        return "boolean"
    if ty == "array":
        return f"{typescript(schema['items'], indent)}[]" if "items" in schema else "Array<any>"
    return "any"


def _object(schema: dict, indent: str) -> str:
    out = ""
    if isinstance(schema.get("description"), str):
        out += f"{indent}// {schema['description']}\n"
    out += "{\n"
    props = schema.get("properties")
    required = {r for r in schema.get("required") or [] if isinstance(r, str)} \
        if isinstance(schema.get("required"), list) else set()
    for key, val in (props.items() if isinstance(props, dict) else ()):
        val = val if isinstance(val, dict) else {}
        mark = "" if key in required else "?"
        if isinstance(val.get("title"), str):
            out += f"{indent}// {val['title']}\n{indent}//\n"
        one_of = val.get("oneOf")
        if one_of is None and isinstance(val.get("description"), str):
            out += f"{indent}// {val['description']}\n"
        examples = val.get("examples")
        if isinstance(examples, list) and examples:
            out += f"{indent}// Examples:\n"
            out += "".join(f'{indent}// - "{ex}"\n' for ex in examples if isinstance(ex, str))
        if isinstance(one_of, list):
            out += _one_of_property(key, mark, val, one_of, indent)
            continue
        text = _nullable(val, typescript(val, indent + "    "))
        out += f"{indent}{key}{mark}: {text},"
        if one_of is None and "default" in val:
            out += " // " + _default(val)
        out += "\n"
    return out + f"{indent}}}"


def _one_of_property(key: str, mark: str, val: dict, variants: list, indent: str) -> str:
    out = ""
    desc = val.get("description") if isinstance(val.get("description"), str) else None
    first = variants[0] if variants and isinstance(variants[0], dict) else {}
    above = desc is not None and first.get("description") != desc
    if above:
        out += f"{indent}// {desc}\n"
    if "default" in val:
        out += f"{indent}// {_default(val)}\n"
    out += f"{indent}{key}{mark}:\n"
    for k, variant in enumerate(variants):
        out += f"{indent} | " + _nullable(variant, typescript(variant, indent + "   "))
        comments = []
        if isinstance(variant, dict):
            vdesc = variant.get("description")
            if not (k == 0 and above) and isinstance(vdesc, str) and vdesc != desc:
                comments.append(vdesc)
            if "default" in variant:
                comments.append(_default(variant))
        if comments:
            out += " // " + " ".join(comments)
        out += "\n"
    return out + f"{indent},\n"


# -- parsing ----------------------------------------------------------------------------------------
@dataclass
class Message:
    """One message of a reply, as its header said: the text of its body."""
    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None
    text: str
    kind: str  # "reasoning", "content", "call" or "ignored" (not the assistant's)


@dataclass
class Reply:
    """A whole reply: OpenAI's reasoning_content, content and tool_calls."""
    reasoning: str
    content: str
    calls: list[ToolCall] = field(default_factory=list)


def parse(text: str) -> Reply:
    """A whole reply (the text after the prompt's `<|start|>assistant`): its streamed deltas,
    collected."""
    p = StreamParser()
    return Reply(*collect(p.feed(text) + p.finish()))


_ENDS = (END, RETURN, CALL, START)  # what ends a message's body (<|start|>: one left unended)
_BODY_END = re.compile("|".join(map(re.escape, _ENDS)))
_HEAD_END = re.compile("|".join(map(re.escape, (MESSAGE,) + _ENDS)))


def _tail(s: str, start: int) -> int:
    """The length of the longest end of s[start:] that could begin a tag that ends a body."""
    longest = min(max(map(len, _ENDS)) - 1, len(s) - start)
    return next((k for k in range(longest, 0, -1) if any(t.startswith(s[len(s) - k:]) for t in _ENDS)), 0)


def parse_header(header: str, role: str | None = None) -> tuple[str, str | None, str | None, str | None]:
    """(role, channel, recipient, content type) of a header: the text between <|start|> and
    <|message|> (for the reply's first message, after the prompt's `assistant`: `role` given).
    ` to=...` may come before or after the channel; the content type is `json` or
    `<|constrain|>json`, as openai-harmony reads them."""
    channel = None
    i = header.find(CHANNEL)
    if i >= 0:
        after = header[i + len(CHANNEL):]
        m = re.match(r"[^\s<]*", after)
        channel = m.group(0) or None
        header = header[:i] + " " + after[m.end():]
    header = header.replace(CONSTRAIN, " " + CONSTRAIN)
    parts = header.split()
    if role is None:
        role = parts.pop(0) if parts else "assistant"
    elif parts and parts[0] == role:
        parts.pop(0)
    recipient = content_type = None
    rest = []
    for p in parts:
        if p.startswith("to=") and recipient is None:
            recipient = p[3:]
        else:
            rest.append(p)
    if rest:
        content_type = " ".join(rest)
    return role, channel, recipient, content_type


class StreamParser:
    """Feed the reply's text as it is decoded (special tokens as text); get reasoning, content
    and tool-call deltas as soon as they are known. A tag split across pieces is held back
    until it is whole; a call's id and name go out when its header is whole, then its
    arguments as they are written. A reply cut inside a call still has the call, with the
    arguments written so far (none: "{}"); one cut inside its header is dropped.

    `messages`: the reply's complete messages; `count`: the calls named so far;
    `calls`: the complete calls."""

    def __init__(self):
        self.text = ""
        self.pos = 0  # body text out up to here
        self.at = 0  # where the header being read starts
        self.state = "header"  # header, body, between
        self.first = True  # the first message: its role was the prompt's
        self.message: Message | None = None
        self.messages: list[Message] = []
        self.body = 0  # where the current body starts
        self.count = 0
        self.calls: list[ToolCall] = []
        self.call: ToolCall | None = None  # the call being written
        self.calls_index = 0  # its index among the calls
        self.sent: dict[str, bool] = {"reasoning": False, "content": False}
        self.fresh = False  # the current message has sent nothing of its kind yet
        self.tagged = False  # a tag was seen: the text is harmony

    def feed(self, piece: str) -> list[Delta]:
        self.text += piece
        return self._run(False)

    def finish(self) -> list[Delta]:
        return self._run(True)

    def _run(self, final: bool) -> list[Delta]:
        s, out = self.text, []
        while True:
            if self.state == "between":  # after a message: the next one's <|start|>
                i = s.find(START, self.pos)
                if i < 0:
                    return out
                self.tagged = True
                self.at, self.state, self.first = i + len(START), "header", False
            if self.state == "header":
                m = _HEAD_END.search(s, self.at)
                if m is None:
                    if final:
                        if self.first and not self.tagged and CHANNEL not in s and s[self.at:]:
                            out.append(Delta(content=s[self.at:]))  # not harmony: all content
                        self.pos, self.state = len(s), "between"
                    return out
                self.tagged = True
                if m.group(0) != MESSAGE:  # ended before its body: not a message
                    self.pos = m.start() if m.group(0) == START else m.end()
                    self.state, self.first = "between", False
                    continue
                header = s[self.at:m.start()]
                role, channel, recipient, ctype = parse_header(header, "assistant" if self.first else None)
                if recipient == "all":  # everyone: no recipient
                    recipient = None
                kind = ("ignored" if role != "assistant" else
                        "call" if recipient and recipient.startswith(NAMESPACE + ".") else
                        "reasoning" if recipient or channel == "analysis" else "content")
                self.message = Message(role, channel, recipient, ctype, "", kind)
                self.pos = self.body = m.end()
                self.state, self.fresh = "body", True
                if kind == "call":
                    self.call = ToolCall(recipient[len(NAMESPACE) + 1:], "")
                    self.calls_index = self.count
                    self.count += 1
                    out.append(Delta(index=self.calls_index, id=self.call.id, name=self.call.name, arguments=""))
            # the body
            m = _BODY_END.search(s, self.pos)
            upto = m.start() if m else (len(s) if final else len(s) - _tail(s, self.pos))
            out += self._body(s[self.pos:upto])
            self.pos = upto
            if m is None and not final:
                return out
            self._close(s[self.body:upto], out)
            if m is None:
                self.state = "between"
                return out
            if m.group(0) == START:
                self.at, self.state, self.first = m.end(), "header", False
            else:
                self.pos, self.state = m.end(), "between"

    def _body(self, text: str) -> list[Delta]:
        kind = self.message.kind
        if not text or kind == "ignored":
            return []
        if kind == "call":
            self.call.arguments += text
            return [Delta(index=self.calls_index, arguments=text)]
        if self.fresh and self.sent[kind]:
            text = "\n\n" + text  # a second message of its kind
        self.fresh, self.sent[kind] = False, True
        return [Delta(reasoning=text) if kind == "reasoning" else Delta(content=text)]

    def _close(self, body: str, out: list[Delta]) -> None:
        msg, self.message = self.message, None
        msg.text = body
        self.messages.append(msg)
        if msg.kind == "call":
            if not self.call.arguments:
                self.call.arguments = "{}"
                out.append(Delta(index=self.calls_index, arguments="{}"))
            self.calls.append(self.call)
            self.call = None


# -- grammars (llguidance Lark, for constrain.Grammars.compile(lark=...)) -------------------------
def _tag(tag: str, grammars) -> str:
    """A tag as the grammar names it: gpt-oss's vocabulary holds each as a special token."""
    if grammars is not None and tag not in grammars.special_tokens:
        raise InfernoError(f"this vocabulary has no {tag} token: it does not speak harmony")
    return tag


def _ends(tag: str, grammars) -> str:
    """The stop tag that ends the reply, unless it is an end token (EOS) of the model: then the
    matcher's EOS ends it. Without `grammars`, gpt-oss's: <|return|> and <|call|> are."""
    if grammars is None or grammars.special_tokens.get(tag) in grammars.eos_ids:
        return ""
    return " " + _tag(tag, grammars)


def harmony_grammar(tools, tool_choice="auto", grammars=None, answer: str = "TEXT") -> str:
    """The reply: any number of analysis (or preamble) messages, then an answer on final (auto
    and none) or one call to one of `tools` (to the named one; none for "none") whose arguments
    match its schema. One call: the reply ends at <|call|>. `answer`: what the final message
    holds, as a rule's body (any text; answer_grammar's JSON)."""
    fns = [] if tool_choice == "none" else functions(tools)
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        fns = [f for f in fns if f["name"] == name]
        if not fns:
            raise InfernoError(f"tool_choice names {name!r}, which is not in tools", params=("tool_choice",))
    if not fns and tool_choice != "none":
        raise InfernoError("tool_choice needs a tool in tools", params=("tools", "tool_choice"))
    t = {tag: _tag(tag, grammars) for tag in (START, END, MESSAGE, CHANNEL, CONSTRAIN)}
    lark = ["%llguidance {}", "TEXT: /(.|\\n)*/",
            f'start: (thought {t[END]} {t[START]} "assistant")* reply',
            f'thought: {t[CHANNEL]} "analysis" {t[MESSAGE]} TEXT | {t[CHANNEL]} "commentary" {t[MESSAGE]} TEXT',
            f'ctype: " "? {t[CONSTRAIN]} "json" | " json"']
    calls = []
    for k, f in enumerate(fns):
        to = json.dumps(f" to={NAMESPACE}.{f['name']}")
        lark.append(f'head{k}: {t[CHANNEL]} "commentary" {to} ctype? | {to} {t[CHANNEL]} "commentary" ctype?')
        lark.append(f"call{k}: head{k} {t[MESSAGE]} {json_rule(f['parameters'])}{_ends(CALL, grammars)}")
        calls.append(f"call{k}")
    if tool_choice in ("auto", "none"):
        calls.append("final")
        lark.append(f'final: {t[CHANNEL]} "final" {t[MESSAGE]} {answer}{_ends(RETURN, grammars)}')
    lark.append(f"reply: {' | '.join(calls)}")
    return "\n".join(lark) + "\n"


def answer_grammar(schema: dict, tools=(), tool_choice="auto", grammars=None) -> str:
    """A response format on gpt-oss: the model reasons first, as it always does, and its final
    message holds JSON valid against `schema` (the reply's content is that JSON); or, where
    `tools` are given and tool_choice allows, a call instead. Holding the whole reply to the
    schema instead would leave the model no analysis channel, which it was trained to open."""
    return harmony_grammar(tools or (), tool_choice if tools else "none", grammars,
                           answer=json_rule(schema, lenient=False))


def tool_choice_grammar(tools, tool_choice="auto", parallel: bool = True, grammars=None) -> str | None:
    """The grammar for a request's tool_choice (tools.tool_choice_grammar's, for harmony): None
    without tools. "none" still needs one: the tools are in the prompt, and a harmony reply is
    parsed for calls whatever the request said, so the grammar leaves the model its reasoning
    and an answer, and no call. `parallel` changes nothing: a harmony reply ends at its call."""
    if not tools:
        return None
    if tool_choice not in ("none", "auto", "required") and not isinstance(tool_choice, dict):
        raise InfernoError(f"tool_choice must be none, auto, required or a function, not {tool_choice!r}",
                           params=("tool_choice",))
    return harmony_grammar(tools, tool_choice, grammars)
