"""The API as /openapi.json describes it, for schema-driven clients and fuzzers (Schemathesis).

The request bodies are protocol.py's own models, the ones `parse` validates every request
against, so the document cannot drift from what is accepted. The response bodies are written
as models here (the server builds them as dicts, in protocol.Response); tests/test_openapi.py
checks real responses against these, and runs Schemathesis over the whole document. Each route
lists the statuses it can answer, every error in OpenAI's shape.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from inferno.serve.protocol import ChatRequest, CompletionRequest, EmbeddingRequest
from inferno.serve.responses import ResponsesRequest


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: dict | None = None
    completion_tokens_details: dict | None = None


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: dict


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None
    # a reasoning model's reasoning (gpt-oss's analysis channel), apart from its answer
    reasoning_content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict | None
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict | None
    finish_reason: str | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ChatDelta(BaseModel):
    """What one chunk adds to its choice's message: the role (first), text of its content or of
    its reasoning (a reasoning model's, gpt-oss's analysis), or a tool call's part (id and name
    first, then argument fragments); {} with a finish_reason."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: dict | None
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion (the stream ends with `[DONE]`)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None  # the last chunk's, with stream_options.include_usage


class CompletionChunk(BaseModel):
    """One server-sent event of a streamed text completion (the stream ends with `[DONE]`)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # floats, or base64 of their float32 bytes


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


class ResponseObject(BaseModel):
    """The Responses API's response: its output items (an assistant message, function calls)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[dict]
    usage: dict | None
    error: dict | None
    incomplete_details: dict | None


class ResponseEvent(BaseModel):
    """One streamed Responses API event (response.created, response.output_text.delta, ...)."""

    type: str
    sequence_number: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]


MODELS = (ChatRequest, CompletionRequest, EmbeddingRequest, ResponsesRequest, ErrorBody, ChatCompletion,
          ChatCompletionChunk, Completion, CompletionChunk, EmbeddingList, ResponseObject, ResponseEvent, ModelCard,
          ModelList, Health)
WHY = {400: "a bad request: its body, a field, a value out of range, a prompt over the context",
       401: "a missing or wrong API key (a server started with one)",
       404: "an unknown model",
       413: "a body over the server's limit",
       429: "every slot busy and the queue full: retry after Retry-After",
       500: "a fault in this request's step (the others run on)",
       503: "the model is loading, or failed to: retry after Retry-After"}
GENERATING = (400, 401, 404, 413, 429, 500, 503)


def ref(model: type[BaseModel]) -> dict:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def errors(*statuses: int) -> dict:
    """FastAPI `responses` for these error statuses, each with OpenAI's error body."""
    return {s: {"description": WHY[s], "content": {"application/json": {"schema": ref(ErrorBody)}}}
            for s in statuses}


def post(request: type[BaseModel], response: type[BaseModel], chunk: type[BaseModel] | None = None) -> dict:
    """A POST route's documentation: its body, its answer (JSON, or with `stream` server-sent
    events of `chunk`s), its errors."""
    content = {"application/json": {"schema": ref(response)}}
    if chunk is not None:
        # Each event (OpenAPI 3.2's form of one): its data a chunk as JSON, the last one [DONE].
        json_data = {"type": "string", "contentMediaType": "application/json", "contentSchema": ref(chunk)}
        content["text/event-stream"] = {"itemSchema": {
            "type": "object", "required": ["data"],
            "anyOf": [{"properties": {"data": {"const": "[DONE]"}}}, {"properties": {"data": json_data}}]}}
    return dict(openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": ref(request)}}}},
                responses={200: {"description": "the answer", "content": content}, **errors(*GENERATING)})


def get(response: type[BaseModel], *statuses: int) -> dict:
    return dict(responses={200: {"description": "the answer", "content": {"application/json": {"schema": ref(response)}}},
                           **errors(*statuses)})


def document(app, names: list[str]) -> dict:
    """The app's OpenAPI document with every model above in its components; a request's
    `model` is one of the `names` this server answers to (any other is a 404)."""
    from fastapi.openapi.utils import get_openapi
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                          description="OpenAI's chat, completions and embeddings APIs, served by inferno")
        for op in (op for ops in doc["paths"].values() for op in ops.values()):
            op["responses"].pop("422", None)  # FastAPI's for a path parameter: a string, never refused
        _, defs = models_json_schema([(m, "validation") for m in MODELS], ref_template="#/components/schemas/{model}")
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        schemas.update(defs["$defs"])
        for request in (ChatRequest, CompletionRequest, EmbeddingRequest, ResponsesRequest):
            schemas[request.__name__]["properties"]["model"]["enum"] = names
        app.openapi_schema = doc
    return app.openapi_schema
