"""What a tool call is, whatever format a model writes it in (tools.py's formats, harmony.py's):
the tools a request declares, a parsed call, a streamed piece of a reply, and the grammar rule
for a call's arguments."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from inferno.constrain import JSON_OPTIONS, json_defaults
from inferno.errors import InfernoError


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


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))


@dataclass
class Delta:
    """Streamed output: content text, reasoning text (harmony's analysis), or part of tool call
    `index` (id and name in its first delta, then argument fragments that concatenate to its
    arguments)."""
    content: str | None = None
    reasoning: str | None = None
    index: int | None = None
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


def json_rule(schema: dict, lenient: bool = True) -> str:
    """A llguidance Lark rule matching JSON valid against `schema` (a tool's parameters)."""
    # lenient: a keyword llguidance does not implement (an unknown "format") is ignored in a
    # tool's parameters rather than failing the request (a response format's schema is held to
    # what it says, as constrain.Grammars.compile holds it). Closed objects and bounded
    # numbers, as for any schema (constrain.json_defaults).
    return "%json " + json.dumps({"x-guidance": {**JSON_OPTIONS, "lenient": lenient}, **json_defaults(schema)})


def collect(deltas) -> tuple[str, str, list[ToolCall]]:
    """(reasoning, content, calls) of a whole reply, from its streamed deltas: what a parser's
    feed and finish gave."""
    reasoning, content, calls = [], [], []
    for d in deltas:
        if d.reasoning is not None:
            reasoning.append(d.reasoning)
        elif d.content is not None:
            content.append(d.content)
        elif d.name is not None:
            calls.append(ToolCall(d.name, d.arguments, d.id))
        else:
            calls[d.index].arguments += d.arguments
    return "".join(reasoning), "".join(content), calls
