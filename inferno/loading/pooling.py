"""What a model's files say about embedding with it (inferno/embedding.py pools): a
sentence-transformers folder's modules.json (its Pooling module's mode, its Dense layers in
order), config.json's Matryoshka sizes (vLLM's fields), or a GGUF's `{arch}.pooling_type`
(llama.cpp's enum)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferno.errors import InfernoError

# llama.cpp's enum llama_pooling_type, as GGUF files store it (4, "rank", is a reranker's).
GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}
# sentence-transformers' Pooling modes, new spelling and the older flags of its config.json.
ST_POOLING = {"lasttoken": "last", "mean": "mean", "cls": "cls"}
ST_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
            "pooling_mode_lasttoken": "last", "pooling_mode_max_tokens": "max",
            "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens": "weightedmean"}
ACTIVATIONS = {"torch.nn.modules.linear.Identity": lambda v: v, "torch.nn.modules.activation.Tanh": np.tanh}


@dataclass(frozen=True)
class Dense:
    """A sentence-transformers Dense module: activation(v @ weight.T + bias)."""

    weight: np.ndarray  # [out, in] float32
    bias: np.ndarray | None
    activation: str

    def __call__(self, v: np.ndarray) -> np.ndarray:
        out = v @ self.weight.T
        if self.bias is not None:
            out = out + self.bias
        return ACTIVATIONS[self.activation](out).astype(np.float32)


@dataclass(frozen=True)
class EmbeddingSpec:
    """What a model's files say about embedding with it."""

    pooling: str | None = None  # None: the files name none (a chat model)
    dense: tuple[Dense, ...] = ()
    dimensions: tuple[int, ...] | None = None  # Matryoshka sizes it was trained for; None: not
    # sentence-transformers 6 renders a text as a user message through the chat template where
    # its folder's modality_config has "message" (older saves tokenize the text as it is).
    as_message: bool = False
    source: str = ""  # where the pooling came from, for messages

    @property
    def is_embedding_model(self) -> bool:
        return self.pooling is not None

    def width(self, hidden: int) -> int:
        """The vectors' length before any truncation."""
        return self.dense[-1].weight.shape[0] if self.dense else hidden

    def check_dimensions(self, dimensions: int | None, hidden: int) -> None:
        if dimensions is None:
            return
        width = self.width(hidden)
        if self.dimensions is None:
            raise InfernoError("dimensions: this model was not trained to be truncated (its config.json has no "
                               "matryoshka_dimensions or is_matryoshka): leave dimensions out", params=("dimensions",))
        if not 1 <= dimensions <= width or (self.dimensions and dimensions not in self.dimensions):
            sizes = ", ".join(map(str, self.dimensions)) if self.dimensions else f"1 to {width}"
            raise InfernoError(f"dimensions must be one of the model's sizes ({sizes}), got {dimensions}",
                               params=("dimensions",))


def spec_from_folder(folder: Path, config: dict) -> EmbeddingSpec:
    """A Hugging Face folder's: sentence-transformers' modules.json (a Pooling module's mode,
    Dense modules, in order), and config.json's Matryoshka sizes (vLLM's fields)."""
    dims = config.get("matryoshka_dimensions")
    dimensions = tuple(int(d) for d in dims) if isinstance(dims, list) else (() if config.get("is_matryoshka") else None)
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return EmbeddingSpec(dimensions=dimensions)
    try:
        modules = json.loads(modules_path.read_text())
        pooling, dense = None, []
        for module in modules:
            kind, path = str(module.get("type", "")).rsplit(".", 1)[-1], folder / module.get("path", "")
            if kind == "Pooling":
                pooling = _st_pooling(json.loads((path / "config.json").read_text()), path)
            elif kind == "Dense":
                dense.append(_dense(path))
            elif kind not in ("Transformer", "Normalize"):
                raise InfernoError(f"{modules_path}: sentence-transformers module {kind} is not supported "
                                   f"(supported: Transformer, Pooling, Dense, Normalize)")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InfernoError(f"{modules_path}: not a readable sentence-transformers layout ({type(e).__name__}: {e})")
    return EmbeddingSpec(pooling, tuple(dense), dimensions, source="modules.json" if pooling else "",
                         as_message="message" in _st_modalities(folder))


def _st_modalities(folder: Path) -> dict:
    path = folder / "sentence_bert_config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
        return config.get("modality_config") or {}
    except (OSError, ValueError, AttributeError) as e:
        raise InfernoError(f"{path}: not readable ({type(e).__name__}: {e})")


def _st_pooling(config: dict, path: Path) -> str:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [m for flag, m in ST_FLAGS.items() if config.get(flag)]
        mode = modes if len(modes) != 1 else modes[0]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if mode not in ST_POOLING:
        raise InfernoError(f"{path}: pooling {mode!r} is not supported (supported: "
                           f"{', '.join(ST_POOLING)})")
    if config.get("include_prompt", True) is False:
        raise InfernoError(f"{path}: pooling without the prompt (include_prompt false) is not supported")
    return ST_POOLING[mode]


def _dense(path: Path) -> Dense:
    from inferno.formats.safetensors import load_folder_tensors
    config = json.loads((path / "config.json").read_text())
    activation = config.get("activation_function", "torch.nn.modules.linear.Identity")
    if activation not in ACTIVATIONS:
        raise InfernoError(f"{path}: Dense activation {activation} is not supported "
                           f"(supported: {', '.join(ACTIVATIONS)})")
    tensors = {name: _float32(t) for name, t in load_folder_tensors(path).items()}
    return Dense(tensors["linear.weight"], tensors.get("linear.bias"), activation)


def _float32(t) -> np.ndarray:
    return t.dequantize() if hasattr(t, "dequantize") else np.asarray(t, np.float32)


def spec_from_gguf(meta: dict, arch: str, dense=()) -> EmbeddingSpec:
    """A GGUF's `{arch}.pooling_type`, and the Dense matrices ([out, in], no bias, no
    activation: EmbeddingGemma's dense_2 and dense_3) that follow the pooling."""
    value = meta.get(f"{arch}.pooling_type")
    if value is None:
        return EmbeddingSpec()
    if value not in GGUF_POOLING:
        raise InfernoError(f"{arch}.pooling_type {value!r} is not supported (supported: "
                           + ", ".join(f"{k} ({v})" for k, v in GGUF_POOLING.items()) + ")")
    layers = tuple(Dense(_float32(w), None, "torch.nn.modules.linear.Identity") for w in dense)
    return EmbeddingSpec(GGUF_POOLING[value], layers, source=f"{arch}.pooling_type")


