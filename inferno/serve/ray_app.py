"""`inferno serve --ray`: the same FastAPI app as Ray Serve replicas, behind Ray's router.

Each replica builds the app (`__serve_build_asgi_app__`) and loads its own engine during its
lifespan startup, so Ray marks it ready only once the model is in; each gets `num_cpus` of the
cluster, and the pool backend that many threads. Ray's router spreads requests over replicas;
each replica batches its own. With `address` (`ray start --head` prints it; "auto" finds a
local one) the replicas go wherever the cluster has room, on any node; without it a local
cluster starts in this process.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import replace

from inferno.errors import InfernoError
from inferno.serve.app import ServerConfig, build_app


def deployment(config: ServerConfig, replicas: int, cpus: int):
    """A bound Ray Serve application of `replicas` replicas of `config`'s server."""
    from ray import serve

    options = dict(config.backend_options)
    if config.backend == "pool" and options.get("threads") is None:
        options["threads"] = cpus  # Numba's default is every core of the node, not our share
    config = replace(config, backend_options=tuple(options.items()))

    # Ray's router must not hold back what the scheduler would queue: the replica answers 429.
    @serve.deployment(name="inferno", num_replicas=replicas, ray_actor_options={"num_cpus": cpus},
                      max_ongoing_requests=config.parallel + config.queue_limit + 1)
    @serve.ingress()
    class Inferno:
        def __init__(self, config: ServerConfig):
            self.config = config

        def __serve_build_asgi_app__(self):
            return build_app(self.config, background_load=False)

        def check_health(self):
            error = self.app.state.inferno.error  # `app`: Ray's wrapper's, the one built above
            if error is not None:
                raise RuntimeError(error)

    return Inferno.bind(config)


def run(config: ServerConfig, *, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1,
        address: str | None = None, cpus_per_replica: int | None = None) -> int:
    try:
        import ray
        from ray import serve
    except ImportError as e:
        raise InfernoError(f"--ray needs Ray Serve: pip install -e '.[ray]' in inferno's folder ({e})") from None
    ray.init(address=address, include_dashboard=False, log_to_driver=True)
    try:
        cpus = cpus_per_replica or max(1, int(ray.cluster_resources().get("CPU", 1)) // replicas)
        serve.start(http_options={"host": host, "port": port})
        serve.run(deployment(config, replicas, cpus), name="inferno", route_prefix="/")
        print(f"serving {config.served_name} on http://{host}:{port} with {replicas} Ray Serve "
              f"replicas of {cpus} CPUs; SIGTERM or Ctrl-C stops", flush=True)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())
        stop.wait()
        serve.shutdown()  # each replica finishes its running requests first
    finally:
        ray.shutdown()
    return 0

