"""The tokenizer a GGUF file describes under `tokenizer.ggml.*`, rebuilt as a `tokenizers` one.

A GGUF carries no tokenizer.json: it stores the vocabulary, the merges, each token's type and
the name of a pre-tokenizer (`tokenizer.ggml.pre`, e.g. 'smollm', 'qwen2', 'llama-bpe').
llama.cpp maps that name to a list of regexes, each splitting the pieces the previous one left
(matches and the text between them both kept); `tokenizers`' Split(..., "isolated") does the same,
so the table below is llama.cpp's (llama-vocab.cpp), with Qwen2's and Llama 3's case-insensitive
contractions written as in their tokenizer.json.
"""

from __future__ import annotations

from inferno.errors import InfernoError, one_line
from inferno.model.tokenizer import Tokenizer

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class Pre:
    """How one family of vocabularies splits text before BPE."""

    def __init__(self, regexes: tuple[str, ...], ignore_merges: bool = False, add_bos: bool = False):
        self.regexes = regexes
        self.ignore_merges = ignore_merges  # a whole piece found in the vocabulary is one token
        self.add_bos = add_bos  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


_DEFAULT = Pre((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_LLAMA3_PRE = Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
_DIGITS_THEN_GPT2 = Pre((r"\p{N}", _GPT2))

# tokenizer.ggml.pre -> how to split; names as llama.cpp spells them.
PRE_TOKENIZERS = {
    "default": _DEFAULT,
    **dict.fromkeys(["gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4"], Pre((_GPT2,))),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"], _LLAMA3_PRE),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"], Pre((_QWEN2,))),
    **dict.fromkeys(["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b"], _DIGITS_THEN_GPT2),
    "falcon": Pre((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
    **dict.fromkeys(["gpt-4o", "llama4"], Pre((_GPT4O,))),
}

# llama.cpp's token types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_KEYS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}
# Turn enders beyond eos: llama.cpp stops on eot/eom too.
STOP_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")
# ChatML models end a turn with <|im_end|>; their base text ends with <|endoftext|>.
QWEN3_STOPS = ("<|im_end|>", "<|endoftext|>")


def tokenizer_from_gguf(meta: dict, source: str) -> Tokenizer:
    """The file's tokenizer wrapped like a folder's: chat template, special tokens, stop ids.
    A malformed vocabulary is one InfernoError, whatever the `tokenizers` library would raise."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise InfernoError(f"{source}: GGUF tokenizer {kind!r:.80} is not supported; inferno reads "
                           f"byte-level BPE vocabularies ('gpt2', as SmolLM2, Llama 3 and Qwen use)")
    name = meta.get("tokenizer.ggml.pre", "default")
    pre = PRE_TOKENIZERS.get(name) if isinstance(name, str) else None
    if pre is None:
        raise InfernoError(f"{source}: GGUF pre-tokenizer {name!r:.80} is not supported "
                           f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    tokens = _array(meta, "tokens", str, source)
    if tokens is None:
        raise InfernoError(f"{source}: the GGUF file has no tokenizer.ggml.tokens vocabulary")
    types = _array(meta, "token_type", int, source) or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise _corrupt(source, f"{len(types)} token types for {len(tokens)} tokens")
    merges = _array(meta, "merges", str, source)
    if merges is None:
        raise InfernoError(f"{source}: the GGUF vocabulary has no tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise _corrupt(source, "a merge is not two tokens separated by a space")
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise _corrupt(source, "tokenizer.chat_template is not text")

    # The vocabulary as stored: byte-level tokens spelled in GPT-2's byte alphabet, added
    # tokens (control, user-defined) as their text, so both find their ids.
    vocab = dict(zip(tokens, range(len(tokens))))
    special = {key: tokens[meta[f"tokenizer.ggml.{field}"]] for key, field in SPECIAL_KEYS.items()
               if _valid_id(meta.get(f"tokenizer.ggml.{field}"), tokens)}
    try:  # the library raises plain Exception (a merge out of the vocabulary, a bad template)
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges))
        if meta.get("tokenizer.ggml.add_bos_token", pre.add_bos) and "bos_token" in special:
            bos = special["bos_token"]
            hf.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    except Exception as e:
        raise _corrupt(source, f"the tokenizers library refuses its vocabulary: {one_line(e)}") from None
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>) match whole and are skipped when decoding; user-defined ones
    # (<think>) match whole and are kept, as llama.cpp treats them.
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, kind in zip(tokens, types) if kind == CONTROL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, kind in zip(tokens, types) if kind == USER_DEFINED])

    stops = [meta[f"tokenizer.ggml.{k}"] for k in STOP_KEYS if _valid_id(meta.get(f"tokenizer.ggml.{k}"), tokens)]
    if meta.get("general.architecture") == "qwen3":
        stops += [vocab[t] for t in QWEN3_STOPS if t in vocab]
    return Tokenizer(hf, chat_template=template, special_tokens=special, eos_ids=stops)


def _array(meta: dict, field: str, kind: type, source: str) -> list | None:
    """tokenizer.ggml.FIELD as a list of `kind`, None when absent. A GGUF array holds one
    value type, so its first element's type is every element's."""
    value = meta.get(f"tokenizer.ggml.{field}")
    if value is None:
        return None
    if not isinstance(value, list) or (value and not isinstance(value[0], kind)):
        raise _corrupt(source, f"tokenizer.ggml.{field} is not a list of {kind.__name__}")
    return value


def _valid_id(token_id, tokens: list) -> bool:
    return type(token_id) is int and 0 <= token_id < len(tokens)


def _corrupt(source: str, what: str) -> InfernoError:
    return InfernoError(f"{source}: corrupt GGUF vocabulary ({what}); download the file again")
