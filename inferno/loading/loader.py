"""Checkpoints: what a model file or folder holds, in one shape whatever the format.

A checkpoint is a config, weights under Hugging Face names, and a tokenizer. A folder
(config.json, *.safetensors, tokenizer.json) is read here; other sources produce the same shape.
Weights are as stored where the backends can use them so: QuantTensors (16-bit or GGML blocks)
and read-only float32 views for matrices, float32 arrays for vectors.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import numpy as np

from inferno.errors import InfernoError
from inferno.loading.checkpoint import Checkpoint, progress_bar
from inferno.formats.quant import QTYPES, QuantTensor, as_float32, mxfp4_from_hf
from inferno.model.config import ModelConfig
from inferno.loading.gguf import load_gguf
from inferno.loading.pooling import spec_from_folder
from inferno.formats.gguf_file import MAGIC
from inferno.loading.resolve import resolve
from inferno.formats.safetensors import load_folder_tensors
from inferno.sampling import generation_config_sampling
from inferno.tokenizers.tokenizer import Tokenizer, read_json

FOLDER_CONTENTS = "config.json, *.safetensors and tokenizer.json"


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
    if "text_config" in raw:  # a multimodal folder: its text model is what inferno runs
        tensors = text_model_tensors(tensors)
    elif "embed_tokens.weight" in tensors:  # a base model's (Qwen3Model, as sentence-transformers saves it)
        tensors = {("model." + n if not n.startswith("lm_head.") else n): t for n, t in tensors.items()}
    config = ModelConfig.from_hf(raw, extra_eos=generation.get("eos_token_id"),
                                 has_lm_head="lm_head.weight" in tensors)
    if config.experts is not None:
        tensors = stack_experts(tensors, config, folder)
    if config.family.norm_plus_one:
        # Gemma's RMSNorm scales by (1 + w): folded into w here, in float32 as transformers adds
        # it, so the forward pass has one norm for every family (a GGUF stores it folded).
        tensors = {n: np.asarray(t, np.float32) + np.float32(1.0) if n.endswith("norm.weight") else t
                   for n, t in tensors.items()}
    tokenizer = Tokenizer.from_folder(folder, eos_ids=config.eos_token_ids)
    sampling = [("generation_config.json", generation_config_sampling(generation))]
    return Checkpoint(config, tensors, tokenizer, source=str(folder), sampling=sampling,
                      embedding=spec_from_folder(folder, raw))


# Where multimodal checkpoints keep the text model (transformers 5's and 4's spellings, Gemma 3's
# Gemma3ForConditionalGeneration); the vision tower and projector are left out.
TEXT_MODEL_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.",
                       "language_model.lm_head.": "lm_head.", "lm_head.": "lm_head."}


def text_model_tensors(tensors: dict) -> dict:
    """The text model's tensors of a multimodal checkpoint, under text-model names."""
    out = {}
    for name, t in tensors.items():
        prefix = next((p for p in TEXT_MODEL_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            out[TEXT_MODEL_PREFIXES[prefix] + name[len(prefix):]] = t
    return out


# A folder's expert MLPs under the names inferno keeps (a GGUF's layout): the router, and each of
# the three matrices with every expert's rows end to end, [n_expert * out, in].
ROUTER = "model.layers.{i}.mlp.gate.weight"
STACKED = "model.layers.{i}.mlp.experts.{m}_proj.weight"
# Per-expert names: Qwen3-MoE's (as the Hugging Face hub has them), Mixtral's (w1 the gate, w3
# the up projection, w2 the down one).
PER_EXPERT = {
    "mlp": ("mlp.gate.weight", "mlp.experts.{e}.{m}_proj.weight", {"gate": "gate", "up": "up", "down": "down"}),
    "block_sparse_moe": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.{m}.weight",
                         {"gate": "w1", "up": "w3", "down": "w2"}),
}


def stack_experts(tensors: dict, config: ModelConfig, folder: Path) -> dict:
    """Each sparse layer's experts stacked into the three matrices a GGUF stores (a copy: a
    folder keeps one tensor per expert). transformers 5's fused form (`mlp.experts.gate_up_proj`
    [n_expert, 2 * inter, hidden], `mlp.experts.down_proj` [n_expert, hidden, inter]) is split and
    reshaped the same way."""
    count = config.experts.count
    for i in config.experts.layers:
        p = f"model.layers.{i}."
        if p + "mlp.router.weight" in tensors:
            gpt_oss_experts(tensors, p, i, folder)
            continue
        fused = tensors.pop(p + "mlp.experts.gate_up_proj", None)
        if fused is not None:
            fused = np.asarray(fused, np.float32)
            e, two_inter, hidden = fused.shape
            down = np.asarray(tensors.pop(p + "mlp.experts.down_proj"), np.float32)
            tensors[STACKED.format(i=i, m="gate")] = fused[:, :two_inter // 2].reshape(-1, hidden)
            tensors[STACKED.format(i=i, m="up")] = fused[:, two_inter // 2:].reshape(-1, hidden)
            tensors[STACKED.format(i=i, m="down")] = down.reshape(-1, down.shape[-1])
            continue
        style = next((s for s, (router, _, _) in PER_EXPERT.items() if p + router in tensors), None)
        if style is None:
            raise InfernoError(f"{folder}: layer {i} should have {count} experts, but it has no "
                               f"router (mlp.gate.weight); the weights do not match config.json")
        router, each, names = PER_EXPERT[style]
        tensors[ROUTER.format(i=i)] = tensors.pop(p + router)
        for m, theirs in names.items():
            parts = []
            for e in range(count):
                name = p + each.format(e=e, m=theirs)
                if name not in tensors:
                    raise InfernoError(f"{folder}: config.json says {count} experts, but {name} is "
                                       f"missing; the weights do not match config.json")
                parts.append(tensors.pop(name))
            if f"{p}{each.format(e=count, m=theirs)}" in tensors:
                raise InfernoError(f"{folder}: layer {i} has more experts than config.json's "
                                   f"{count}; the weights do not match config.json")
            tensors[STACKED.format(i=i, m=m)] = _stack(parts, p + each.format(e="*", m=theirs), folder)
    return tensors


def gpt_oss_experts(tensors: dict, p: str, i: int, folder: Path) -> None:
    """One gpt-oss layer's experts under inferno's names, in place. Its gate_up matrices hold
    gate and up interleaved by output (gate the even ones), transposed ([n_expert, hidden,
    2 * inter]) where they are floats, [out, in] where they are MXFP4 (`_blocks` and `_scales`,
    repacked into ggml's blocks: quant.mxfp4_from_hf); the biases follow the same interleaving."""
    def take(name):
        if p + name not in tensors:
            raise InfernoError(f"{folder}: {p + name} is missing; the weights do not match config.json")
        return tensors.pop(p + name)

    tensors[ROUTER.format(i=i)] = take("mlp.router.weight")
    tensors[p + "mlp.gate.bias"] = as_float32(take("mlp.router.bias"))
    gate_up_bias = as_float32(take("mlp.experts.gate_up_proj_bias"))  # [n_expert, 2 * inter]
    tensors[p + "mlp.experts.gate_proj.bias"] = np.ascontiguousarray(gate_up_bias[:, 0::2])
    tensors[p + "mlp.experts.up_proj.bias"] = np.ascontiguousarray(gate_up_bias[:, 1::2])
    tensors[p + "mlp.experts.down_proj.bias"] = as_float32(take("mlp.experts.down_proj_bias"))
    if p + "mlp.experts.gate_up_proj_blocks" in tensors:
        def experts(m):  # [n_expert, out, row bytes]: ggml's MXFP4 rows
            blocks = take(f"mlp.experts.{m}_proj_blocks")
            return mxfp4_from_hf(blocks, take(f"mlp.experts.{m}_proj_scales")).reshape(*blocks.shape[:2], -1)

        def matrix(t):  # [n_expert, rows, row bytes] -> a stacked MXFP4 matrix
            rows, mx = t.shape[0] * t.shape[1], QTYPES["MXFP4"]
            return QuantTensor(mx, (rows, t.shape[2] // mx.block_bytes * mx.block), np.ascontiguousarray(t).reshape(rows, -1))
    else:
        def experts(m):  # [n_expert, out, in] float32 (stored transposed)
            return np.asarray(take(f"mlp.experts.{m}_proj"), np.float32).transpose(0, 2, 1)

        def matrix(t):
            return np.ascontiguousarray(t).reshape(-1, t.shape[-1])
    gate_up = experts("gate_up")  # [n_expert, 2 * inter, hidden]
    tensors[STACKED.format(i=i, m="gate")] = matrix(gate_up[:, 0::2])
    tensors[STACKED.format(i=i, m="up")] = matrix(gate_up[:, 1::2])
    tensors[STACKED.format(i=i, m="down")] = matrix(experts("down"))


def _stack(parts: list, what: str, folder: Path):
    """Matrices of one shape end to end, as one: 16-bit ones stay 16-bit."""
    shapes = {tuple(t.shape) for t in parts}
    if len(shapes) != 1:
        raise InfernoError(f"{folder}: the experts' {what} differ in shape ({sorted(shapes)[:2]})")
    rows, cols = shapes.pop()
    kinds = {t.qtype.name if isinstance(t, QuantTensor) else None for t in parts}
    if len(kinds) == 1 and None not in kinds:
        return QuantTensor(parts[0].qtype, (rows * len(parts), cols), np.concatenate([t.data for t in parts]))
    return np.concatenate([np.asarray(t.dequantize() if isinstance(t, QuantTensor) else t, np.float32)
                           for t in parts])


def open_checkpoint(model: str | Path | None = None, progress: bool = False) -> Checkpoint:
    """Load `model`: a folder, a .gguf file, a hub id or an alias (None: the default model);
    see inferno.loading.resolve for how each is found or fetched."""

    path = resolve(model)
    with collector_paused():
        if path.is_dir():
            return load_hf_folder(path, progress)
        with open(path, "rb") as f:
            is_gguf = f.read(4) == MAGIC
        if is_gguf or path.suffix == ".gguf":
            return load_gguf(path, progress_bar(progress))
    raise InfernoError(f"{path} is neither a model folder ({FOLDER_CONTENTS}) nor a .gguf file")


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while a checkpoint is read. A vocabulary is
    hundreds of thousands of small strings, lists and tuples (Gemma 3's 262k tokens and 515k
    merges), every one of them counted towards the next collection, and the older generations'
    collections walk all that came before, for no garbage: Gemma 3's tokenizer built in 0.55
    instead of 1.5 s. The collector is process-wide; it is back on (if it was) when the
    checkpoint is open."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
