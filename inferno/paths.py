"""Where inferno keeps what it fetches and derives: one rule for every layer (the model files,
the tokenizer merges, the compiled kernels where the package cannot be written)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """inferno's cache: INFERNO_CACHE, else $XDG_CACHE_HOME/inferno, else ~/.cache/inferno."""
    if os.environ.get("INFERNO_CACHE"):
        return Path(os.environ["INFERNO_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inferno"
