"""A model as read from its files: config, tensors (by Hugging Face name), tokenizer, and what
the loaders share (a progress bar). Both readers (loader.py for folders, gguf.py for GGUF files)
return one."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inferno.formats.quant import QuantTensor
from inferno.model.config import ModelConfig
from inferno.formats.gguf_file import file_type_name
from inferno.loading.pooling import EmbeddingSpec
from inferno.tokenizers.tokenizer import Tokenizer


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, QuantTensor | np.ndarray]  # Hugging Face names
    tokenizer: Tokenizer
    source: str  # where it came from, for messages
    file_format: str = "safetensors"  # or "gguf"
    metadata: dict = field(default_factory=dict)
    # Sampling defaults the model carries, as (where from, {field: value}) layers, later ones
    # winning: generation_config.json, a GGUF's general.sampling.*, an alias's.
    sampling: list = field(default_factory=list)
    embedding: EmbeddingSpec = field(default_factory=EmbeddingSpec)  # pooling, from the files

    def weight_type(self) -> str:
        """The weights' type as llama-bench names it: a GGUF's file type (Q4_K_M: a mix of
        types), else the type holding most of the matrices' elements (BF16, F32, Q8_0)."""
        file_type = self.metadata.get("general.file_type")
        # A hostile file's file_type may be anything.
        if isinstance(file_type, int) and (name := file_type_name(file_type)):
            return name
        elements: dict[str, int] = {}
        for t in self.tensors.values():
            if len(t.shape) == 2:
                name = t.qtype.name if hasattr(t, "qtype") else "F32"
                elements[name] = elements.get(name, 0) + t.shape[0] * t.shape[1]
        return max(elements, key=elements.get) if elements else "F32"


def progress_bar(enabled: bool):
    """A tqdm wrapper on stderr when enabled, else None (loaders then iterate plainly). tqdm is
    imported on first use: most loads now have no slow loop to show."""
    if not enabled:
        return None

    def bar(items, **kwargs):
        from tqdm import tqdm
        return tqdm(items, leave=False, dynamic_ncols=True, **kwargs)
    return bar
