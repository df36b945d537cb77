"""OpenAI's Responses API (POST /v1/responses), as the chat completion it is underneath.

openai-agents' default model calls it, and pydantic-ai and langchain do when asked. A request
becomes a ChatRequest (`ResponsesRequest.to_chat`): `instructions` the system message, the
input items the messages (a function_call an assistant's tool call, a function_call_output the
tool's answer), function tools and `text.format` the chat's tools and response_format. It then
runs on the chat's path (app.start_chat: template, grammar, tool-call parsing, the batch), and
its events come back as Responses output items: a message with output_text, function calls.
Streamed, the chat's deltas become Responses events (`Events`): response.created, an item
added, its text or arguments in deltas, the item done, response.completed. A reasoning model's
reasoning (gpt-oss's analysis, the chat's reasoning_content) is never output text: it is a
reasoning item of its own, its text in `content` (reasoning_text parts, as vLLM and OpenAI's
open-weight guide give gpt-oss's), streamed as response.reasoning_text deltas. `reasoning`
({"effort": ...}) sets the chat's reasoning_effort. The stored conversation keeps the reasoning,
and a reasoning item sent back in `input` (a client that manages its own context) joins the
assistant turn after it: a harmony prompt reads it back during a turn of tool calls.

A stored response (`store`, true by default) keeps its conversation, input and output, in
memory (the last STORED of them), so that `previous_response_id` continues it; an unknown id
is a 404, as OpenAI's.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict

from pydantic import ConfigDict, Field, ValidationError

from inferno.serve.protocol import APIError, Body, ChatRequest

STORED = 1024  # responses whose conversations are kept for previous_response_id


class ResponsesRequest(Body):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict]
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    text: dict | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    metadata: dict | None = None
    user: str | None = None
    reasoning: dict | None = None  # {"effort": "low" | "medium" | "high"}: the chat's reasoning_effort

    def check_supported(self) -> None:
        """Every field is read (to_chat); the rest of OpenAI's are ignored, as extra fields are."""

    def to_chat(self, history: list[dict]) -> ChatRequest:
        """The chat completion this request asks for, after the stored conversation `history`."""
        # A stored conversation keeps no instructions: each request gives its own, as OpenAI's.
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions else []) + history
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        messages += input_messages(items)
        body = {"model": self.model, "messages": messages, "parallel_tool_calls": self.parallel_tool_calls,
                "max_tokens": self.max_output_tokens, "temperature": self.temperature, "top_p": self.top_p}
        if (self.reasoning or {}).get("effort") is not None:
            body["reasoning_effort"] = self.reasoning["effort"]
        if self.tools:
            body["tools"] = [chat_tool(t, i) for i, t in enumerate(self.tools)]
        if isinstance(self.tool_choice, dict):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.get("name")}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        fmt = (self.text or {}).get("format") or {"type": "text"}
        if fmt.get("type") == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.get("name"), "schema": fmt.get("schema"), "strict": fmt.get("strict")}}
        elif fmt.get("type") in ("json_object", "text"):
            body["response_format"] = {"type": fmt["type"]}
        else:
            raise APIError(400, f"text.format type {fmt.get('type')!r} is not supported (text, json_object, "
                           f"json_schema)", param="text.format")
        try:
            return ChatRequest.model_validate(body, strict=False)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            if where.startswith("reasoning_effort"):
                where = "reasoning.effort"
            raise APIError(400, f"{where}: {err['msg']}", param="input" if where.startswith("messages") else where) from None


def input_messages(items: list[dict]) -> list[dict]:
    """Responses input items as chat messages."""
    out: list[dict] = []
    held = None  # a reasoning item's text: the reasoning_content of the assistant turn right after it
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought = _reasoning_text(item)
            if thought:
                held = thought if held is None else held + thought
            continue
        if kind == "message":
            m = {"role": item.get("role"), "content": _text(item.get("content"), f"input[{i}].content")}
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if held is None and out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
                continue
            m = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif kind == "function_call_output":
            m = {"role": "tool", "tool_call_id": item.get("call_id"),
                 "content": _text(item.get("output"), f"input[{i}].output")}
        else:
            raise APIError(400, f"input[{i}]: item type {kind!r} is not supported (message, function_call, "
                           f"function_call_output, reasoning)", param="input")
        if held is not None and m["role"] == "assistant":  # (dropped before any other: no template takes it alone)
            m["reasoning_content"] = held
        held = None
        out.append(m)
    return out


def _reasoning_text(item: dict) -> str:
    """A reasoning item's text: its reasoning_text content, else its summary's."""
    parts = item.get("content") or item.get("summary") or []
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def _text(content, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise APIError(400, f"{where}: {kind} parts are not supported, only text", param="input")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise APIError(400, f"{where}: text or a list of text parts", param="input")


def chat_tool(tool: dict, i: int) -> dict:
    if tool.get("type") != "function":
        raise APIError(400, f"tools[{i}]: only function tools are served here, not {tool.get('type')!r}",
                       param="tools")
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}}


# -- what comes back ----------------------------------------------------------------------------
def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or _id("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if text or status == "completed" else []}


def reasoning_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "reasoning", "id": item_id or _id("rs"), "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {"type": "function_call", "id": item_id or _id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


class Reply:
    """One response's envelope, its output items as they are made, and its usage."""

    def __init__(self, req: ResponsesRequest, chat: ChatRequest):
        self.req, self.chat = req, chat
        self.id, self.created = _id("resp"), int(time.time())
        # The conversation, for the store: without this request's instructions (to_chat's first).
        self.messages = [m.as_dict() for m in chat.messages][1 if req.instructions else 0:]
        self.output: list[dict] = []
        self.usage: dict | None = None
        self.finish: str | None = None
        self.reasoning = ""  # the chat's reasoning_content: its items' text, and the stored conversation's

    def body(self, status: str) -> dict:
        req = self.req
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
                "max_output_tokens": req.max_output_tokens, "model": req.model, "output": self.output,
                "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
                "temperature": req.temperature, "top_p": req.top_p, "tool_choice": req.tool_choice or "auto",
                "tools": req.tools or [], "text": req.text or {"format": {"type": "text"}},
                "metadata": req.metadata or {}, "store": req.store, "usage": self.usage}

    @property
    def status(self) -> str:
        return "incomplete" if self.finish == "length" else "completed"

    def set_usage(self, chat_usage: dict) -> None:
        self.usage = {"input_tokens": chat_usage["prompt_tokens"],
                      "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]},
                      "output_tokens": chat_usage["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": chat_usage.get("completion_tokens_details", {})
                                                .get("reasoning_tokens", 0)},
                      "total_tokens": chat_usage["total_tokens"]}

    def whole(self, chat_body: dict) -> dict:
        """The response from the chat completion's non-streamed body."""
        choice = chat_body["choices"][0]
        message, self.finish = choice["message"], choice["finish_reason"]
        self.reasoning = message.get("reasoning_content") or ""
        if self.reasoning:
            self.output.append(reasoning_item(self.reasoning))
        if message.get("content"):
            self.output.append(message_item(message["content"]))
        for call in message.get("tool_calls") or ():
            self.output.append(call_item(call["id"], call["function"]["name"], call["function"]["arguments"]))
        self.set_usage(chat_body["usage"])
        return self.body(self.status)

    def conversation(self) -> list[dict]:
        """The messages a later request continues (previous_response_id): this one's and its reply."""
        text = "".join(p["text"] for item in self.output if item["type"] == "message" for p in item["content"])
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.output if i["type"] == "function_call"]
        reply = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            reply["tool_calls"] = calls
        if self.reasoning:
            reply["reasoning_content"] = self.reasoning
        return self.messages + [reply]


class Events:
    """The chat's streamed choice chunks as Responses events, each numbered."""

    def __init__(self, reply: Reply):
        self.reply, self.seq = reply, 0
        self.message: dict | None = None  # the open message item
        self.thought: dict | None = None  # the open reasoning item
        self.calls: dict[int, dict] = {}  # the chat's call index -> its open function_call item

    def sse(self, kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def opening(self) -> list[str]:
        return [self.sse("response.created", response=self.reply.body("in_progress")),
                self.sse("response.in_progress", response=self.reply.body("in_progress"))]

    def chunk(self, choice: dict) -> list[str]:
        out, delta = [], choice.get("delta") or {}
        if delta.get("reasoning_content"):
            out += self._reasoning(delta["reasoning_content"])
        if delta.get("content") or delta.get("tool_calls"):
            out += self._close_thought()
        if delta.get("content"):
            if self.message is None:
                self.message = message_item("", status="in_progress")
                self.reply.output.append(self.message)
                index = len(self.reply.output) - 1
                out.append(self.sse("response.output_item.added", output_index=index, item=self.message))
                out.append(self.sse("response.content_part.added", item_id=self.message["id"], output_index=index,
                                    content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
                self.message["content"] = [{"type": "output_text", "text": "", "annotations": []}]
            self.message["content"][0]["text"] += delta["content"]
            out.append(self.sse("response.output_text.delta", item_id=self.message["id"], content_index=0,
                                output_index=self.reply.output.index(self.message), delta=delta["content"],
                                logprobs=[]))
        for call in delta.get("tool_calls") or ():
            item = self.calls.get(call["index"])
            if item is None:
                out += self._close_message()
                item = call_item(call.get("id") or _id("call"), call["function"].get("name") or "", "", "in_progress")
                self.calls[call["index"]] = item
                self.reply.output.append(item)
                out.append(self.sse("response.output_item.added", output_index=len(self.reply.output) - 1, item=item))
            arguments = call["function"].get("arguments") or ""
            if arguments:
                item["arguments"] += arguments
                out.append(self.sse("response.function_call_arguments.delta", item_id=item["id"],
                                    output_index=self.reply.output.index(item), delta=arguments))
        if choice.get("finish_reason"):
            self.reply.finish = choice["finish_reason"]
        return out

    def _reasoning(self, text: str) -> list[str]:
        out = []
        self.reply.reasoning += text
        if self.thought is None:
            out += self._close_message()
            self.thought = reasoning_item("", status="in_progress")
            self.reply.output.append(self.thought)
            out.append(self.sse("response.output_item.added", output_index=len(self.reply.output) - 1,
                                item=self.thought))
        self.thought["content"][0]["text"] += text
        out.append(self.sse("response.reasoning_text.delta", item_id=self.thought["id"], content_index=0,
                            output_index=self.reply.output.index(self.thought), delta=text))
        return out

    def _close_thought(self) -> list[str]:
        item, self.thought = self.thought, None
        if item is None:
            return []
        index = self.reply.output.index(item)
        item["status"] = "completed"
        return [self.sse("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                         text=item["content"][0]["text"]),
                self.sse("response.output_item.done", output_index=index, item=item)]

    def _close_message(self) -> list[str]:
        item, self.message = self.message, None
        if item is None:
            return []
        index, text = self.reply.output.index(item), item["content"][0]["text"]
        item["status"] = "completed"
        part = item["content"][0]
        return [self.sse("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text,
                         logprobs=[]),
                self.sse("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part),
                self.sse("response.output_item.done", output_index=index, item=item)]

    def closing(self, chat_usage: dict) -> list[str]:
        out = self._close_thought() + self._close_message()
        for item in self.calls.values():
            index = self.reply.output.index(item)
            item["status"] = "completed"
            out.append(self.sse("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                arguments=item["arguments"]))
            out.append(self.sse("response.output_item.done", output_index=index, item=item))
        self.reply.set_usage(chat_usage)
        status = self.reply.status
        out.append(self.sse(f"response.{status}", response=self.reply.body(status)))
        return out


    def failed(self, message: str) -> str:
        """The event that ends a stream whose generation failed."""
        body = {**self.reply.body("failed"), "error": {"code": "server_error", "message": message}}
        return self.sse("response.failed", response=body)


class Store:
    """Stored responses' conversations, the newest STORED."""

    def __init__(self, size: int = STORED):
        self.size, self.items = size, OrderedDict()

    def get(self, response_id: str | None) -> list[dict]:
        if response_id is None:
            return []
        if response_id not in self.items:
            raise APIError(404, f"previous response {response_id!r} not found: it was not stored (store: false), "
                           f"or this server has restarted or kept only its last {self.size}",
                           param="previous_response_id", code="previous_response_not_found")
        self.items.move_to_end(response_id)
        return list(self.items[response_id])

    def put(self, reply: Reply) -> None:
        if reply.req.store:
            self.items[reply.id] = reply.conversation()
            while len(self.items) > self.size:
                self.items.popitem(last=False)
