"""Checkpoints: what a model file or folder holds, in one shape whatever the format.

A checkpoint is a config, weights under Hugging Face names, and a tokenizer. A folder
(config.json, *.safetensors, tokenizer.json) is read here; other sources produce the same shape.
Weights are as stored where the backends can use them so: QuantTensors (16-bit or GGML blocks)
and read-only float32 views for matrices, float32 arrays for vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inferno.backends.quant import QuantTensor
from inferno.errors import InfernoError
from inferno.model.config import ModelConfig
from inferno.model.gguf_file import MAGIC
from inferno.model.resolve import resolve
from inferno.model.safetensors import load_folder_tensors
from inferno.model.sampling import generation_config_sampling
from inferno.model.tokenizer import Tokenizer, read_json

FOLDER_CONTENTS = "config.json, *.safetensors and tokenizer.json"


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


def progress_bar(enabled: bool):
    """A tqdm wrapper on stderr when enabled, else None (loaders then iterate plainly). tqdm is
    imported on first use: most loads now have no slow loop to show."""
    if not enabled:
        return None

    def bar(items, **kwargs):
        from tqdm import tqdm
        return tqdm(items, leave=False, dynamic_ncols=True, **kwargs)
    return bar


def load_hf_folder(folder: Path, progress: bool = False) -> Checkpoint:
    folder = Path(folder)
    if not folder.is_dir():
        raise InfernoError(f"model folder {folder} does not exist (it should hold {FOLDER_CONTENTS})")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise InfernoError(f"{folder}: no config.json (a model folder holds {FOLDER_CONTENTS})")
    raw = read_json(config_path)
    generation = read_json(folder / "generation_config.json")
    tensors = load_folder_tensors(folder, progress_bar(progress))
    config = ModelConfig.from_hf(raw, extra_eos=generation.get("eos_token_id"),
                                 has_lm_head="lm_head.weight" in tensors)
    tokenizer = Tokenizer.from_folder(folder, eos_ids=config.eos_token_ids)
    sampling = [("generation_config.json", generation_config_sampling(generation))]
    return Checkpoint(config, tensors, tokenizer, source=str(folder), sampling=sampling)


def open_checkpoint(model: str | Path | None = None, progress: bool = False) -> Checkpoint:
    """Load `model`: a folder, a .gguf file, a hub id or an alias (None: the default model);
    see inferno.model.resolve for how each is found or fetched."""
    from inferno.model.gguf import load_gguf  # here: gguf.py imports this module

    path = resolve(model)
    if path.is_dir():
        return load_hf_folder(path, progress)
    with open(path, "rb") as f:
        is_gguf = f.read(4) == MAGIC
    if is_gguf or path.suffix == ".gguf":
        return load_gguf(path, progress_bar(progress))
    raise InfernoError(f"{path} is neither a model folder ({FOLDER_CONTENTS}) nor a .gguf file")
