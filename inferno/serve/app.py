"""The HTTP API: OpenAI's chat and text completions, embeddings and responses, models, health and
metrics, on FastAPI.

    app = build_app(ServerConfig(model="smollm2-135m", backend="pool", parallel=8))

The app owns its engine through its lifespan: startup loads the model on a thread (so /health
answers 503 while it loads, as llama.cpp's server does) and starts the BatchEngine; shutdown
stops it and closes the engine. uvicorn runs it (server.py), and so does each Ray Serve
replica (ray_app.py): the same app, nothing written twice.

A streamed response ends when the client goes away: Starlette cancels its generator, whose
`finally` cancels the request, and the scheduler frees the slot at its next step. A request
waiting for a whole (non-streamed) answer watches for the disconnect itself.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from inferno.backends import DEFAULT_BACKEND
from inferno.errors import InfernoError
from inferno.serve import openapi
from inferno.serve.metrics import Metrics
from inferno.serve.responses import Events, Reply, ResponsesRequest, Store
from inferno.serve.openapi import (ChatCompletion, ChatCompletionChunk, Completion, CompletionChunk, EmbeddingList,
                                   Health, ModelCard, ModelList, ResponseEvent, ResponseObject, errors, get, post)
from inferno.serve.protocol import (APIError, ChatRequest, CompletionRequest, EmbeddingRequest, NamedChoice,
                                    Response, TokenText, embeddings_body, usage)
from inferno import harmony as H
from inferno.constrain import ANY_OBJECT
from inferno.tools import HARMONY, functions, tool_choice_grammar
from inferno.serve.batch import BatchEngine, Closed, Handle, QueueFull

log = logging.getLogger("inferno.serve")

BODY_LIMIT = 1 << 20  # bytes; a larger body is a 413
PAGE = Path(__file__).parent / "page" / "index.html"


@dataclass(frozen=True)
class ServerConfig:
    """What `inferno serve` loads and how it batches; `model_id` is the name clients send
    (default: the model's alias, or its file or folder name)."""

    model: str | None = None
    backend: str = DEFAULT_BACKEND
    backend_options: tuple[tuple[str, object], ...] = ()
    parallel: int = 4
    ctx_size: int | None = None
    queue_limit: int = 64
    chunk: int = 256
    flash: bool = True
    cache_type: str | None = None
    weights: str | None = None
    api_key: str | None = None
    model_id: str | None = None
    speculative: int = 0  # --draft-max under --spec-type: every request's drafts, unless it says
    spec_type: str = "ngram"  # --spec-type's drafter (draft.py)
    model_draft: str | None = None  # --model-draft: a draft model, loaded with the target
    embeddings: bool = False  # --embeddings: serve /v1/embeddings with a model that is not made for it
    pooling: str | None = None  # --pooling: over what the model's files say (embedding.POOLINGS)
    reasoning_format: str = "auto"  # --reasoning-format: auto, a think block as reasoning_content; none

    @property
    def served_name(self) -> str:
        from inferno.loading.resolve import DEFAULT_MODEL
        if self.model_id:
            return self.model_id
        model = self.model or DEFAULT_MODEL
        path = Path(model).expanduser()
        return (path.stem if path.suffix == ".gguf" else path.name) if path.exists() else model

    def load(self, metrics: Metrics) -> BatchEngine:
        from inferno.engine import load
        # pool keeps its own defaults (every core, OpenMP's spinning workers): with the engine
        # on one thread (batch.py) they served 8 streams best here; see bench/RESULTS.md.
        options = dict(self.backend_options)
        # Loaded on the batch's own thread, which then runs every step (batch.py: one
        # OpenMP team on pool).
        return BatchEngine(lambda: load(self.model, backend=self.backend, flash=self.flash,
                                        cache_type=self.cache_type, weights=self.weights,
                                        draft=self.model_draft, progress=False, **options),
                           parallel=self.parallel, ctx_size=self.ctx_size,
                           queue_limit=self.queue_limit, chunk=self.chunk, metrics=metrics)


class State:
    """The app's engine, once loaded, and what the routes need besides."""

    def __init__(self, config: ServerConfig, load: Callable[[Metrics], BatchEngine]):
        self.config, self.load_fn = config, load
        self.names = {config.served_name, config.model or config.served_name}
        self.metrics = Metrics()
        self.batch: BatchEngine | None = None
        self.tokens: TokenText | None = None
        self.error: str | None = None
        self.loaded = threading.Event()  # set when the load ends, well or not
        self.responses = Store()  # stored Responses API conversations (previous_response_id)

    def load(self) -> None:
        t0 = time.perf_counter()
        try:
            batch = self.load_fn(self.metrics)
        except BaseException as e:  # noqa: BLE001  reported by /health and the server's exit
            self.error = e.for_cli() if isinstance(e, InfernoError) else f"{type(e).__name__}: {e}"
            # a bad file or flag is the user's to fix, and its message says how; anything else
            # is a fault of ours, and its traceback is what a bug report needs
            log.error("loading the model failed: %s", self.error, exc_info=not isinstance(e, InfernoError))
        else:
            self.tokens = TokenText(batch.engine.tokenizer)
            # llguidance's view of the vocabulary, built now: on a first constrained request it
            # would hold the GIL (and so every stream) for up to a second.
            batch.engine.grammars.lltok
            self.batch = batch
            e = batch.engine
            log.info("load: %.2f s (%s, %s backend%s); %d slots x %d positions, KV cache %.0f MiB",
                     time.perf_counter() - t0, e.source, e.backend, e.size_note, batch.parallel, batch.ctx_size,
                     batch.cache_bytes / 2**20)
        self.loaded.set()

    def ready(self) -> BatchEngine:
        if self.batch is None:
            raise APIError(503, self.error or "the model is loading: retry shortly", kind="server_error",
                           headers={"Retry-After": "1"})
        return self.batch

    async def accept(self, request: Request, model: type[BaseModel]):
        """(the engine, the request's body as `model`), or the APIError that answers it."""
        batch = self.ready()
        req = await parse(request, model)
        if req.model not in self.names:
            raise APIError(404, f"the model {req.model!r} does not exist: this server has "
                           f"{self.config.served_name!r}", param="model", code="model_not_found")
        req.check_supported()
        return batch, req


def build_app(config: ServerConfig, load: Callable[[Metrics], BatchEngine] | None = None, *,
              background_load: bool = True) -> FastAPI:
    """The app for `config`; `load(metrics)` returns the BatchEngine (default: config.load).
    `background_load`: serve (/health 503) while the model loads, rather than load first."""
    state = State(config, load or config.load)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if background_load:
            threading.Thread(target=state.load, name="inferno-load", daemon=True).start()
        else:
            await asyncio.to_thread(state.load)
        yield
        if state.batch is not None:
            await asyncio.to_thread(state.batch.close)
            state.batch.engine.close()

    app = FastAPI(title="inferno", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.inferno = state
    app.add_middleware(LimitBody, limit=BODY_LIMIT)
    app.add_middleware(CountRequests, metrics=state.metrics)  # outermost: it counts the 413s too
    for exc, handler in HANDLERS.items():
        app.add_exception_handler(exc, handler)

    app.openapi = lambda: openapi.document(app, [config.served_name])  # (not --model's path, which is taken too)

    @app.get("/", include_in_schema=False)
    async def page():
        """The chat page (page/index.html): it talks to this server's /v1 API."""
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.get("/health", **get(Health, 503))
    async def health():
        state.ready()
        return {"status": "ok"}

    api = APIRouter(dependencies=[Depends(authorize(config.api_key))])

    @api.get("/metrics", responses={200: {"description": "Prometheus text", "content": {"text/plain": {}}},
                                    **errors(401)})
    async def metrics():
        gauges = {}
        if state.batch is not None:
            s = state.batch.stats()
            gauges = {"inferno_sequences_running": ("sequences in a slot", s["running"]),
                      "inferno_sequences_waiting": ("sequences queued for a slot", s["waiting"]),
                      "inferno_kv_slots_used": ("KV cache slots in use", s["slots_used"]),
                      "inferno_kv_slots": ("KV cache slots (--parallel)", s["slots"])}
        return PlainTextResponse(state.metrics.render(gauges), media_type="text/plain; version=0.0.4")

    def model_card() -> dict:
        """OpenAI's model object, with vLLM's max_model_len: the positions of a slot."""
        card = {"id": config.served_name, "object": "model", "created": int(time.time()), "owned_by": "inferno"}
        return {**card, "max_model_len": state.batch.ctx_size} if state.batch is not None else card

    @api.get("/v1/models", **get(ModelList, 401, 503))
    async def models():
        state.ready()
        return {"object": "list", "data": [model_card()]}

    @api.get("/v1/models/{model:path}", **get(ModelCard, 401, 404, 503))
    async def model(model: str):
        state.ready()
        if model not in state.names:
            raise APIError(404, f"the model {model!r} does not exist: this server has {config.served_name!r}",
                           param="model", code="model_not_found")
        return model_card()

    @api.post("/v1/chat/completions", **post(ChatRequest, ChatCompletion, ChatCompletionChunk))
    async def chat(request: Request):
        batch, req = await state.accept(request, ChatRequest)
        resp, handle = await start_chat(batch, req)
        return await respond(request, req, resp, handle)

    @api.post("/v1/responses", **post(ResponsesRequest, ResponseObject, ResponseEvent))
    async def responses(request: Request):
        batch, req = await state.accept(request, ResponsesRequest)
        chat_req = req.to_chat(state.responses.get(req.previous_response_id))
        try:
            chat_req.check_supported()
            resp, handle = await start_chat(batch, chat_req)
        except APIError as e:  # named as this request names its fields
            e.param = RESPONSES_PARAMS.get(e.param, e.param)
            raise
        reply = Reply(req, chat_req)
        request.state.handle = handle
        if req.stream:
            return StreamingResponse(stream_response(reply, resp, handle, state.responses),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        events = await collect(request, handle)
        body = reply.whole(resp.whole(events, handle.prompt_tokens))
        state.responses.put(reply)
        return JSONResponse(body)

    async def start_chat(batch: BatchEngine, req: ChatRequest) -> tuple[Response, Handle]:
        """A chat completion's request queued: its envelope and handle. A harmony model's (gpt-oss)
        prompt is harmony.render's, with the request's reasoning_effort, and its replies are
        parsed into reasoning_content, content and tool_calls, tools or not (engine.reply_format)."""
        engine = batch.engine
        try:
            tools = functions(req.tool_dicts) if req.tools else None
            ids = engine.encode_prompt([m.as_dict() for m in req.messages], tools=req.tool_dicts,
                                       reasoning_effort=req.reasoning_effort)
        except InfernoError as e:
            param = next((p for p in e.params if p in ("tools", "reasoning_effort")), "messages")
            raise APIError(400, str(e), param=param) from None
        rf = req.response_format
        spec = req.constraint()
        choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedChoice) else req.tool_choice or "auto"
        schema = harmony_answer(engine, spec)
        if schema is not None:  # gpt-oss: its reasoning first, the schema holding its answer
            try:
                lark = await asyncio.to_thread(H.answer_grammar, schema, tools, choice, engine.grammars)
            except InfernoError as e:
                raise APIError(400, str(e), param=e.params[0] if e.params else "response_format") from None
            grammar = await compile_constraint(engine, {"lark": lark}, param="response_format")
        else:
            grammar = await compile_constraint(engine, spec, "response_format" if rf and rf.type != "text" else None)
        tool_format = engine.tool_format if req.calls_tools else engine.reply_format
        # tool_choice "none" has a grammar where the format parses calls anyway (harmony's), and
        # no other constraint holds the reply
        if req.tools and schema is None and (req.calls_tools or grammar is None):
            try:
                lark = await asyncio.to_thread(tool_choice_grammar, engine.tool_format, tools, choice,
                                               req.parallel_tool_calls, engine.grammars)
            except InfernoError as e:  # (harmony's: a vocabulary without its tags)
                raise APIError(400, str(e), param=e.params[0] if e.params else "tools") from None
            if lark is not None:
                grammar = await compile_constraint(engine, {"lark": lark}, param="tools")
        max_tokens = req.max_completion_tokens or req.max_tokens or max(1, batch.ctx_size - len(ids))
        options = req.options(engine.sampling, max_tokens, req.logprobs, req.top_logprobs or 0, grammar,
                              tool_format, config.speculative, config.spec_type)
        fenced = grammar is not None and grammar.fenced
        think = None if fenced or config.reasoning_format == "none" else engine.think_block(ids)
        return (Response("chat", req.model, state.tokens, tool_format, fenced=fenced, think=think),
                submit(batch, ids, options, req.n, "max_completion_tokens"))

    @api.post("/v1/completions", **post(CompletionRequest, Completion, CompletionChunk))
    async def completions(request: Request):
        batch, req = await state.accept(request, CompletionRequest)
        tok = batch.engine.tokenizer
        prompts = req.prompt if isinstance(req.prompt, list) and req.prompt and not isinstance(req.prompt[0], int) else [req.prompt]
        ids = [tok.encode(p, add_special_tokens=True) if isinstance(p, str) else p for p in prompts]
        grammar = await compile_constraint(batch.engine, req.constraint())
        max_tokens = req.max_tokens or max(1, batch.ctx_size - max(map(len, ids)))
        options = req.options(batch.engine.sampling, max_tokens, req.logprobs is not None, req.logprobs or 0, grammar,
                              speculative=config.speculative, spec_type=config.spec_type)
        return await respond(request, req, Response("text", req.model, state.tokens),
                             submit(batch, ids, options, req.n, "max_tokens"))

    @api.post("/v1/embeddings", **post(EmbeddingRequest, EmbeddingList))
    async def embeddings(request: Request):
        batch, req = await state.accept(request, EmbeddingRequest)
        engine = batch.engine
        if not (config.embeddings or engine.embedding.is_embedding_model):
            raise APIError(400, f"this server does not serve embeddings: {config.served_name} is not an "
                           f"embedding model. Start it with `inferno serve --embeddings` to embed with it "
                           f"anyway (last-token pooling), or serve an embedding model", param="input",
                           code="embeddings_disabled")
        try:
            embedder = engine.embedder(config.pooling, normalize=req.normalize, dimensions=req.dimensions)
            if embedder.pooling == "none":
                raise APIError(400, "pooling none gives a vector per token, which the OpenAI API has no "
                               "shape for: start the server with --pooling last, mean or cls", param="input")
            prompts = engine.embed_ids(req.input)
        except InfernoError as e:
            raise APIError(400, str(e), param=e.params[0] if e.params else "input") from None
        handle = enqueue(batch.embed, prompts, embedder, loop=asyncio.get_running_loop())
        request.state.handle = handle
        events = await collect(request, handle, "embedding")
        if any(ev.embedding is None for ev in events):  # cancelled: the server is stopping
            raise APIError(503, "the server is shutting down: retry", kind="server_error")
        vectors = [ev.embedding for ev in sorted(events, key=lambda ev: ev.index)]
        return JSONResponse(embeddings_body(req.model, vectors, handle.prompt_tokens, req.encoding_format))

    app.include_router(api)
    return app


def harmony_answer(engine, spec: dict | None) -> dict | None:
    """The JSON Schema a harmony model's (gpt-oss's) final message must match, where the request
    asks for JSON (response_format, json_schema); None where the model is not harmony's or the
    request asks for nothing, or for a grammar or regex (those hold the whole reply)."""
    if engine.reply_format != HARMONY or not spec or not {"json_schema", "json_object"} & spec.keys():
        return None
    schema = spec.get("json_schema") or ANY_OBJECT
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise APIError(400, f"json_schema is not valid JSON: {e}", param="json_schema") from None
    if not isinstance(schema, dict):
        raise APIError(400, f"json_schema must be a JSON object, not {type(schema).__name__}", param="json_schema")
    return schema


async def compile_constraint(engine, spec: dict | None, param: str | None = None):
    """The request's compiled constraint (None: none), off the event loop: a first use builds
    llguidance's tokenizer, and a big schema takes a while. A bad one is a 400 naming it."""
    if spec is None:
        return None
    try:
        return await asyncio.to_thread(engine.constraint, **spec)
    except InfernoError as e:
        raise APIError(400, str(e), param=param or next(iter(spec))) from None


def authorize(api_key: str | None):
    expected = f"Bearer {api_key}".encode() if api_key else None

    async def check(request: Request):
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):  # constant time: no timing oracle on the key
            raise APIError(401, "invalid or missing API key: send Authorization: Bearer <key>",
                           code="invalid_api_key")
    return check


def submit(batch: BatchEngine, ids, options, n: int, max_field: str) -> Handle:
    return enqueue(batch.submit, ids, options, n=n, loop=asyncio.get_running_loop(), max_field=max_field)


def enqueue(call, *args, max_field: str | None = None, **kwargs) -> Handle:
    """A request queued on the batch (`call`: its submit or embed), or the APIError that
    answers it: 429 when the queue is full, 503 while closing, 400 for its own values."""
    try:
        return call(*args, **kwargs)
    except QueueFull as e:
        raise APIError(429, str(e), kind="rate_limit_exceeded", code="rate_limit_exceeded",
                       headers={"Retry-After": "1"}) from None
    except Closed as e:
        raise APIError(503, str(e), kind="server_error") from None
    except InfernoError as e:  # the request's own values: its field is the error's first param
        param = e.params[0] if e.params else None
        raise APIError(400, str(e), param=max_field if param == "max_tokens" else param) from None


async def respond(request: Request, req, resp: Response, handle: Handle):
    request.state.handle = handle  # for the request's log line (CountRequests)
    if req.stream:
        return StreamingResponse(stream(resp, handle, req.include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    body = resp.whole(await collect(request, handle), handle.prompt_tokens)
    return JSONResponse({**body, "timings": handle.timings()})


async def collect(request: Request, handle: Handle, what: str = "generation") -> list:
    """Every event of a request answered whole, the request cancelled if its client goes."""
    watcher = asyncio.create_task(cancel_on_disconnect(request, handle))
    try:
        events = [ev async for ev in handle]
    finally:
        watcher.cancel()
        handle.cancel()  # a no-op once every sequence has finished
    errors = [ev.error for ev in events if ev.error]
    if errors:
        raise APIError(500, f"{what} failed: {errors[0]}", kind="server_error")
    return events


async def cancel_on_disconnect(request: Request, handle: Handle) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    handle.cancel()


async def stream(resp: Response, handle: Handle, include_usage: bool):
    """Server-sent events: a role chunk per chat choice, one chunk per event, usage, [DONE]."""
    extra = {"usage": None} if include_usage else {}

    def sse(body: dict) -> str:
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    try:
        if resp.kind == "chat":
            opening = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None} for i in range(handle.n)]
            yield sse({**resp.envelope(opening, stream=True), **extra})
        completion_tokens = cached_tokens = drafted = accepted = 0
        async for ev in handle:
            if ev.error:
                yield sse(APIError(500, f"generation failed: {ev.error}", kind="server_error").body())
                return
            completion_tokens += ev.completion_tokens
            cached_tokens += ev.cached_tokens
            drafted += ev.drafted_tokens
            accepted += ev.accepted_tokens
            for choice in resp.chunk_choices(ev):
                yield sse({**resp.envelope([choice], stream=True), **extra})
        if include_usage:  # and llama-server's timings, which its web page (and ours) show
            yield sse({**resp.envelope([], stream=True), "timings": handle.timings(),
                       "usage": usage(handle.prompt_tokens, completion_tokens, cached_tokens, drafted, accepted,
                                      resp.reasoning_tokens)})
        yield "data: [DONE]\n\n"
    finally:
        handle.cancel()  # the client went away (the generator is cancelled), or a choice failed


# The chat's fields that a Responses request names otherwise.
RESPONSES_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format"}


async def stream_response(reply: Reply, resp: Response, handle: Handle, store: Store):
    """A streamed Responses API answer: its events (responses.Events), stored once complete."""
    events = Events(reply)
    try:
        for line in events.opening():
            yield line
        completion = cached = 0
        async for ev in handle:
            if ev.error:
                yield events.failed(f"generation failed: {ev.error}")
                return
            completion += ev.completion_tokens
            cached += ev.cached_tokens
            for choice in resp.chunk_choices(ev):
                for line in events.chunk(choice):
                    yield line
        for line in events.closing(usage(handle.prompt_tokens, completion, cached, reasoning=resp.reasoning_tokens)):
            yield line
        store.put(reply)
    finally:
        handle.cancel()


def _union_tag(part) -> bool:
    """pydantic names a union's branch in an error's location: `str`, `list[TextPart]`,
    `constrained-str` (a str with a rule, Field(min_length=1))."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part
                                      or part.startswith("constrained-"))


# -- errors in OpenAI's shape -----------------------------------------------------------------
def _api_error(request: Request, e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def parse(request: Request, model: type[BaseModel]):
    """The body as `model`, whatever its Content-Type says (curl -d sends a form's); pydantic's
    first complaint is a 400 naming the field, not FastAPI's 422."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        # A union reports each branch: the deepest complaint is the one about what was sent.
        err = max(e.errors(), key=lambda x: len(x["loc"]))
        where = ".".join(str(p) for p in err["loc"] if not _union_tag(p))
        if err["type"] == "json_invalid":
            message = f"the body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}"
        else:
            message = f"{where}: {err['msg']}" if where else f"the body must be a JSON object: {err['msg']}"
        raise APIError(400, message, param=where or None) from None


ROUTES = ("GET / (the chat page), POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, "
          "POST /v1/responses, GET /v1/models, GET /v1/models/{id}, GET /metrics, GET /health")


def _http_error(request: Request, e: HTTPException) -> JSONResponse:
    kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
    message = str(e.detail)
    if e.status_code in (404, 405):  # as OpenAI words it, with what is served here
        message = f"Invalid URL ({request.method} {request.url.path}): this server serves {ROUTES}"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                        status_code=e.status_code, headers=getattr(e, "headers", None))


def _server_error(request: Request, e: Exception) -> JSONResponse:
    log.error("request failed: %s: %s", type(e).__name__, e, exc_info=e)
    return _api_error(request, APIError(500, f"internal error: {type(e).__name__}: {e}", kind="server_error"))


HANDLERS = {APIError: _api_error, HTTPException: _http_error, Exception: _server_error}


# -- ASGI middleware --------------------------------------------------------------------------
async def _send_json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


class LimitBody:
    """A body over `limit` bytes is a 413, whether it declares its length or is chunked: the
    body is read here (up to the limit) and handed on whole."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        too_big = APIError(413, f"the request body is over the limit of {self.limit} bytes").body()
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            return await _send_json(send, 413, too_big)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body was in
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await _send_json(send, 413, too_big)
            if not message.get("more_body"):
                break
        first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay():
            nonlocal first
            if first is not None:
                message, first = first, None
                return message
            return await receive()
        await self.app(scope, replay, send)


class CountRequests:
    """inferno_requests_total by status, for the API's routes, and a log line for each: method,
    path, status, and for a generation its prompt, cached and generated tokens, time to first
    token and total time."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [0]

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                self.metrics.count_request(message["status"])
            await send(message)
        try:
            await self.app(scope, receive, counting_send)
        finally:
            handle = scope.get("state", {}).get("handle")
            tokens = f" {handle.summary()}" if handle is not None else ""
            log.info("%s %s %d%s, %.0f ms", scope["method"], scope["path"], status[0], tokens,
                     (time.perf_counter() - t0) * 1e3)
