"""inferno: a multi-backend CPU/GPU inference engine for Llama, Qwen and Gemma LLMs."""

from inferno.engine import Engine, GenerationResult, Session, load
from inferno.errors import InfernoError

__version__ = "0.1.0"
__all__ = ["Engine", "GenerationResult", "InfernoError", "Session", "load", "__version__"]
