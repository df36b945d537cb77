"""`inferno serve`: continuous batching (batch.py, over inferno/scheduler.py) behind an OpenAI-compatible HTTP API
(app.py), on uvicorn or as Ray Serve replicas (ray_app.py)."""

from inferno.sequence import Event, Options, TokenLogprob
from inferno.serve.batch import BatchEngine, Closed, Handle, QueueFull

__all__ = ["BatchEngine", "Closed", "Event", "Handle", "Options", "QueueFull", "TokenLogprob"]
