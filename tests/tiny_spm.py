"""A tiny SentencePiece vocabulary (Llama 2's kind: BPE, byte fallback, a dummy-prefix space)
trained here with the sentencepiece library, and written into a GGUF the way llama.cpp's
convert_hf_to_gguf.py writes one (`_create_vocab_sentencepiece`): every piece with its score and
type, added tokens marked user-defined, and the tokenizer.ggml flags."""

from __future__ import annotations

import io
from pathlib import Path

import gguf
from tiny import CORPUS

EXTRA = [
    "Hello world, the quick brown fox jumps over the lazy dog 1234567890.",
    "  indented\n\tcode()  {\n    return 0;\n}\n",
    "Water boils at a temperature of 100 degrees Celsius.",
]


def train(vocab_size: int = 400, dummy_prefix: bool = True, user_defined: tuple[str, ...] = ()):
    """A trained sentencepiece processor with Llama 2's trainer settings."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 3 + EXTRA), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, hard_vocab_limit=False, byte_fallback=True, character_coverage=1.0,
        add_dummy_prefix=dummy_prefix, remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, normalization_rule_name="identity",
        user_defined_symbols=list(user_defined), unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def add_vocab(w: gguf.GGUFWriter, sp, *, user_defined: tuple[str, ...] = (), add_bos: bool = True,
              add_eos: bool = False, add_space_prefix: bool | None = None) -> None:
    """`sp`'s pieces as a tokenizer.ggml.model = llama vocabulary."""
    T = gguf.TokenType
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(sp.get_score(i))
        types.append(T.UNKNOWN if sp.is_unknown(i) else T.CONTROL if sp.is_control(i)
                     else T.UNUSED if sp.is_unused(i) else T.BYTE if sp.is_byte(i)
                     else T.USER_DEFINED if piece in user_defined else T.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    if add_space_prefix is not None:  # absent in most Llama 2 files: llama.cpp then adds it
        w.add_add_space_prefix(add_space_prefix)


def write_vocab_gguf(sp, out: Path, **flags) -> Path:
    """A GGUF holding only the vocabulary (and the few hyperparameters transformers' tokenizer
    loader reads): enough for tokenizers, not a model."""
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    add_vocab(w, sp, **flags)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
