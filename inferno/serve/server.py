"""`inferno serve` on uvicorn: bind (127.0.0.1 unless told), serve, and on SIGTERM drain.

uvicorn's graceful shutdown is the drain: it stops accepting, lets running responses finish
(for up to `drain_timeout` seconds, then cancels them, which cancels their requests), and runs
the app's lifespan shutdown, which stops the scheduler and closes the engine.
"""

from __future__ import annotations

import logging
import signal
import threading

from inferno.errors import InfernoError
from inferno.serve.app import ServerConfig, build_app


def run(config: ServerConfig, *, host: str = "127.0.0.1", port: int = 8000,
        drain_timeout: float = 30.0, log_level: str = "info") -> int:
    import uvicorn

    _log_to_stderr(log_level)
    app = build_app(config)
    state = app.state.inferno
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           access_log=False, timeout_graceful_shutdown=drain_timeout))

    def stop_if_load_fails():
        state.loaded.wait()
        if state.error is not None:
            server.should_exit = True
        else:
            shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
            logging.getLogger("inferno.serve").info("ready: the chat page at http://%s:%d/, the API at /v1", shown, port)
    threading.Thread(target=stop_if_load_fails, daemon=True).start()

    # uvicorn raises the signal that stopped it again once it has shut down, for the handler it
    # found: this one makes a drained SIGTERM a clean exit (0) instead of death by signal.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if state.error is not None:
        raise InfernoError(f"loading the model failed: {state.error}")
    return 0


def _log_to_stderr(level: str) -> None:
    logger = logging.getLogger("inferno")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
