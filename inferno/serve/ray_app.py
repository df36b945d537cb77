"""`inferno serve --ray`: the same FastAPI app as Ray Serve replicas, behind Ray's router.

Each replica builds the app (`__serve_build_asgi_app__`) and loads its own engine during its
lifespan startup, so Ray marks it ready only once the model is in; each gets `num_cpus` of the
cluster, and the pool backend that many threads. Ray's router spreads requests over replicas;
each replica batches its own. With `address` (`ray start --head` prints it; "auto" finds a
local one) the replicas go wherever the cluster has room, on any node; without it a local
cluster starts in this process.

`--router prefix` routes on the prompt instead: a conversation's next turn goes to the replica
that served its earlier turns, whose slots still hold its prefix (prefix reuse), unless the
replicas' queues differ by IMBALANCE requests or more, where power-of-two choices takes over.
Ray's router sees a request's handle-call arguments, not an HTTP body, so the app is then two
deployments: a gateway (no CPUs of its own) that reads each request's messages or prompt
and hands the whole request to the replicas through a handle, and the replicas, each running
the same app in-process (asgi_call), routed by Ray Serve LLM's PrefixCacheAffinityRouter (a
prefix tree of recent prompts per replica; PrefixRouter counts how much of each prompt it
matched: its hit rate).
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import threading
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from inferno.errors import InfernoError
from inferno.serve.app import ServerConfig, build_app

# Requests of difference between the replicas' queues past which the prefix router routes on
# load alone (power-of-two choices). A bigger bound lets a prefix that every conversation
# shares (an agent's system prompt) pull them all onto one replica while the other idles
# (bench/RESULTS.md, "Routing on the prefix across Ray Serve replicas").
IMBALANCE = 2


@dataclass
class Routed:
    """An HTTP request as the gateway hands it to a replica. `prompt` is what the prefix router
    matches (Ray's reads an argument's `prompt` or `messages`): a chat's messages, a
    completion's prompt, a response's input; "" for the rest."""

    method: str
    path: str
    query: bytes
    headers: list
    body: bytes
    prompt: object = ""


def routing_text(path: str, body: bytes):
    """The part of a request's JSON body its prefix is matched on."""
    if not path.startswith("/v1/") or not body:
        return ""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    for key in ("messages", "prompt", "input"):
        value = data.get(key)
        if isinstance(value, (str, list)):
            return value if key == "messages" or isinstance(value, str) else json.dumps(value)
    return ""


async def asgi_call(app, req: Routed):
    """Run one request through an ASGI app in this process: yields ("start", status, headers),
    then the body's pieces as the app sends them (a stream stays a stream). Cancelling the
    generator (the client went away) cancels the app's handler."""
    queue: asyncio.Queue = asyncio.Queue()
    given = False

    async def receive():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect to report: a cancel ends the handler

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": req.method,
             "scheme": "http", "path": req.path, "raw_path": req.path.encode(), "query_string": req.query,
             "root_path": "", "headers": req.headers, "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    task = asyncio.create_task(app(scope, receive, queue.put))
    try:
        while True:
            get = asyncio.create_task(queue.get())
            await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():  # the app ended without another message: an error
                get.cancel()
                task.result()
                raise RuntimeError(f"{req.method} {req.path}: the app ended without a whole response")
            message = get.result()
            if message["type"] == "http.response.start":
                yield ("start", message["status"], message.get("headers", []))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body"):
                    return
    finally:
        if not task.done():
            task.cancel()


def __getattr__(name: str):
    """`PrefixRouter`, made on first use: Ray is imported only by --ray, and Ray's controller
    finds a router class by its module and name."""
    if name == "PrefixRouter":
        return prefix_router()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def prefix_router():
    """PrefixRouter: Ray Serve LLM's prefix-affinity router, counting the characters of each
    prompt the chosen replica's prefix tree already held."""
    try:
        from ray.serve.llm.request_router import PrefixCacheAffinityRouter
    except ImportError:  # ray.serve.llm's package imports pyarrow (ray[llm]); the router itself needs none
        from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
            PrefixCacheAffinityRouter)
    from ray.util.metrics import Counter

    class PrefixRouter(PrefixCacheAffinityRouter):
        def initialize_state(self, **kwargs):
            super().initialize_state(**kwargs)
            tags = ("deployment",)
            self._prompt_chars = Counter("inferno_router_prompt_chars", "prompt characters routed", tags)
            self._matched_chars = Counter("inferno_router_matched_chars",
                                          "prompt characters the chosen replica had seen before (hit rate: "
                                          "this over inferno_router_prompt_chars)", tags)

        def _extract_text_from_request(self, pending_request):
            # None for no prompt (GET /v1/models, /health): Ray's router divides by the text's
            # length, and skips a None, routing it on load alone.
            return super()._extract_text_from_request(pending_request) or None

        def on_request_routed(self, pending_request, replica_id, result):
            import ray

            text = self._extract_text_from_request(pending_request) if pending_request is not None and \
                pending_request.args else ""
            if text:
                matched, tenants = ray.get(self._tree_actor.prefix_match.remote(
                    text, [replica_id.to_full_id_str()]))
                tags = {"deployment": self._deployment_id.name if self._deployment_id else ""}
                self._prompt_chars.inc(len(text), tags)
                if tenants and matched:  # (a Counter takes increments above zero only)
                    self._matched_chars.inc(len(matched), tags)
            super().on_request_routed(pending_request, replica_id, result)

    PrefixRouter.__module__, PrefixRouter.__qualname__ = __name__, "PrefixRouter"  # as Ray finds it
    return PrefixRouter


def replica_config(config: ServerConfig, cpus: int) -> ServerConfig:
    """A replica's server config: the pool backend on its share of the cores (Numba's default
    is every core of the node, not our share)."""
    options = dict(config.backend_options)
    if config.backend == "pool" and options.get("threads") is None:
        options["threads"] = cpus
    return replace(config, backend_options=tuple(options.items()))


def replica_options(config: ServerConfig, replicas: int, cpus: int) -> dict:
    """serve.deployment's options for the replicas. Ray's router must not hold back what the
    scheduler would queue: the replica answers 429."""
    return dict(name="inferno", num_replicas=replicas, ray_actor_options={"num_cpus": cpus},
                max_ongoing_requests=config.parallel + config.queue_limit + 1)


def check_health(app) -> None:
    """A replica's health for Ray: the engine's load error, if it failed."""
    error = app.state.inferno.error
    if error is not None:
        raise RuntimeError(error)


def deployment(config: ServerConfig, replicas: int, cpus: int):
    """A bound Ray Serve application of `replicas` replicas of `config`'s server."""
    from ray import serve

    config = replica_config(config, cpus)

    @serve.deployment(**replica_options(config, replicas, cpus))
    @serve.ingress()
    class Inferno:
        def __init__(self, config: ServerConfig):
            self.config = config

        def __serve_build_asgi_app__(self):
            return build_app(self.config, background_load=False)

        def check_health(self):
            check_health(self.app)  # `app`: Ray's wrapper's, the one built above

    return Inferno.bind(config)


def routed_deployment(config: ServerConfig, replicas: int, cpus: int):
    """`deployment`'s replicas behind a gateway, routed on each request's prefix (the module's
    docstring says why two deployments)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    config = replica_config(config, cpus)
    router = RequestRouterConfig(request_router_class=prefix_router(),
                                 request_router_kwargs={"imbalanced_threshold": IMBALANCE})
    options = replica_options(config, replicas, cpus)

    @serve.deployment(**options, request_router_config=router)
    class Replica:
        async def __init__(self, config: ServerConfig):
            self.app = build_app(config, background_load=False)
            self._life = self.app.router.lifespan_context(self.app)
            await self._life.__aenter__()  # the model loads here: ready once it is in

        async def handle(self, req: Routed):
            async for piece in asgi_call(self.app, req):
                yield piece

        def check_health(self):
            check_health(self.app)

    gateway_app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @serve.deployment(name="gateway", ray_actor_options={"num_cpus": 0},
                      max_ongoing_requests=replicas * options["max_ongoing_requests"])
    @serve.ingress(gateway_app)
    class Gateway:
        def __init__(self, replicas):
            self.replicas = replicas.options(stream=True, method_name="handle")

        async def forward(self, request, path):
            body = await request.body()
            req = Routed(request.method, request.url.path, request.url.query.encode(), list(request.headers.raw),
                         body, routing_text(request.url.path, body))
            pieces = self.replicas.remote(req)
            _, status, headers = await pieces.__anext__()
            kept = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers
                    if k.lower() not in (b"content-length", b"transfer-encoding")}
            return StreamingResponse(pieces, status_code=status, headers=kept)

        # Classes, not the strings `from __future__ import annotations` makes: Ray rebuilds the
        # routes in the gateway's process, where a string would name nothing.
        forward.__annotations__.update(request=Request, path=str)
        forward = gateway_app.api_route("/{path:path}", methods=["GET", "POST", "DELETE", "PUT", "PATCH"])(forward)

    return Gateway.bind(Replica.bind(config))


def run(config: ServerConfig, *, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1,
        address: str | None = None, cpus_per_replica: int | None = None, router: str = "default") -> int:
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise InfernoError(f"--ray needs Ray Serve: pip install -e '.[ray]' in inferno's folder ({e})") from None
    ray.init(address=address, include_dashboard=False, log_to_driver=True)
    try:
        cpus = cpus_per_replica or max(1, int(ray.cluster_resources().get("CPU", 1)) // replicas)
        serve.start(http_options={"host": host, "port": port})
        app = (routed_deployment if router == "prefix" else deployment)(config, replicas, cpus)
        serve.run(app, name="inferno", route_prefix="/")
        print(f"serving {config.served_name} on http://{host}:{port} with {replicas} Ray Serve "
              f"replicas of {cpus} CPUs, {router} router; SIGTERM or Ctrl-C stops", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())
        stop.wait()
        serve.shutdown()  # each replica finishes its running requests first
    finally:
        ray.shutdown()
    return 0

