"""`inferno serve`: continuous batching (scheduler.py) behind an OpenAI-compatible HTTP API
(app.py), on uvicorn or as Ray Serve replicas (ray_app.py)."""

from inferno.serve.scheduler import BatchEngine, Closed, Handle, QueueFull
from inferno.serve.sequence import Event, Options, TokenLogprob

__all__ = ["BatchEngine", "Closed", "Event", "Handle", "Options", "QueueFull", "TokenLogprob"]
