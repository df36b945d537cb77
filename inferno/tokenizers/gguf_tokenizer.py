"""The tokenizer a GGUF file describes under `tokenizer.ggml.*`, rebuilt as a `tokenizers` one.

A GGUF carries no tokenizer.json: it stores the vocabulary, each token's type and, by
`tokenizer.ggml.model`, the rest of the tokenizer:

- 'gpt2', byte-level BPE (SmolLM2, Llama 3, Qwen): the merges, and the name of a pre-tokenizer
  (`tokenizer.ggml.pre`, e.g. 'smollm', 'qwen2', 'llama-bpe'). llama.cpp maps that name to a list
  of regexes, each splitting the pieces the previous one left (matches and the text between them
  both kept); `tokenizers`' Split(..., "isolated") does the same, so the table below is
  llama.cpp's (llama-vocab.cpp), with Qwen2's and Llama 3's case-insensitive contractions written
  as in their tokenizer.json.
- 'llama', SentencePiece BPE (Llama 2, TinyLlama, Mistral, Gemma): a score per token and no
  merges. llama.cpp (llm_tokenizer_spm) starts from single characters and keeps merging the
  adjacent pair whose union is the best-scored token; characters no token covers fall back to
  the <0xNN> byte tokens. That is a BPE whose merges are every split of every token into two
  tokens, ranked by the whole token's score, so the merges are written out here and `tokenizers`'
  BPE (with byte_fallback) runs them. Spaces are "▁"; see `_sentencepiece` for the space prefix.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

import numpy as np

from inferno.errors import InfernoError, one_line
from inferno.tokenizers.tokenizer import Tokenizer

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


# Turn enders llama.cpp finds by their text, per architecture.
TURN_ENDS = {"qwen3": QWEN3_STOPS, "qwen3moe": QWEN3_STOPS,
             **dict.fromkeys(("gemma", "gemma2", "gemma3"), ("<end_of_turn>",))}


def tokenizer_from_gguf(meta: dict, source: str) -> Tokenizer:
    """The file's tokenizer wrapped like a folder's: chat template, special tokens, stop ids.
    A malformed vocabulary is one InfernoError, whatever the `tokenizers` library would raise."""
    from tokenizers import AddedToken, processors

    kind = meta.get("tokenizer.ggml.model")
    tokens = _array(meta, "tokens", str, source)
    if tokens is None:
        raise InfernoError(f"{source}: the GGUF file has no tokenizer.ggml.tokens vocabulary")
    types = _array(meta, "token_type", int, source) or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise _corrupt(source, f"{len(types)} token types for {len(tokens)} tokens")
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise _corrupt(source, "tokenizer.chat_template is not text")
    try:  # the library raises plain Exception (a merge out of the vocabulary, a bad template)
        if kind == "gpt2":
            hf, add_bos = _byte_level_bpe(meta, tokens, source)
        elif kind == "llama":
            hf = _sentencepiece(meta, tokens, source)
            add_bos = True  # llama.cpp's default for SentencePiece vocabularies
        else:
            raise InfernoError(f"{source}: GGUF tokenizer {kind!r:.80} is not supported; inferno "
                               f"reads byte-level BPE ('gpt2': SmolLM2, Llama 3, Qwen) and "
                               f"SentencePiece ('llama': Llama 2, Mistral, Gemma) vocabularies")

        special = {key: tokens[meta[f"tokenizer.ggml.{field}"]] for key, field in SPECIAL_KEYS.items()
                   if _valid_id(meta.get(f"tokenizer.ggml.{field}"), tokens)}
        # Control (<|im_start|>) and unknown (<unk>) tokens match whole and are skipped when
        # decoding; user-defined ones (<think>) match whole and are kept, as llama.cpp treats
        # them (Gemma's runs of spaces and of newlines are user-defined tokens).
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, kind in zip(tokens, types) if kind in (CONTROL, UNKNOWN)])
        hf.add_tokens([AddedToken(t, special=False, normalized=False)
                       for t, kind in zip(tokens, types) if kind == USER_DEFINED])

        add_bos = meta.get("tokenizer.ggml.add_bos_token", add_bos) is True and "bos_token" in special
        add_eos = meta.get("tokenizer.ggml.add_eos_token", False) is True and "eos_token" in special
        if add_bos or add_eos:
            bos = [special["bos_token"]] if add_bos else []
            eos = [special["eos_token"]] if add_eos else []
            hf.post_processor = processors.TemplateProcessing(
                single=" ".join(bos + ["$A"] + eos), pair=" ".join(bos + ["$A"] + eos + bos + ["$B"] + eos),
                special_tokens=[(t, hf.token_to_id(t)) for t in dict.fromkeys(bos + eos)])
    except InfernoError:
        raise
    except Exception as e:
        raise _corrupt(source, f"the tokenizers library refuses its vocabulary: {one_line(e)}") from None

    stops = [meta[f"tokenizer.ggml.{k}"] for k in STOP_KEYS if _valid_id(meta.get(f"tokenizer.ggml.{k}"), tokens)]
    turn_ends = (hf.token_to_id(t) for t in TURN_ENDS.get(meta.get("general.architecture"), ()))
    stops += [i for i in turn_ends if i is not None]
    return Tokenizer(hf, chat_template=template, special_tokens=special, eos_ids=stops)


def _byte_level_bpe(meta: dict, tokens: list, source: str):
    """GPT-2-style BPE and whether it adds BOS when the file does not say."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    name = meta.get("tokenizer.ggml.pre", "default")
    pre = PRE_TOKENIZERS.get(name) if isinstance(name, str) else None
    if pre is None:
        raise InfernoError(f"{source}: GGUF pre-tokenizer {name!r:.80} is not supported "
                           f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    merges = _array(meta, "merges", str, source)
    if merges is None:
        raise InfernoError(f"{source}: the GGUF vocabulary has no tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise _corrupt(source, "a merge is not two tokens separated by a space")

    # The vocabulary as stored: byte-level tokens spelled in GPT-2's byte alphabet, added
    # tokens (control, user-defined) as their text, so both find their ids.
    vocab = dict(zip(tokens, range(len(tokens))))
    bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges)
    hf = HFTokenizer(bpe)
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    return hf, pre.add_bos


def _sentencepiece(meta: dict, tokens: list, source: str):
    """SentencePiece BPE as llama.cpp runs it.

    The space prefix (`tokenizer.ggml.add_space_prefix`, true unless the file says otherwise;
    Gemma's is false): llama.cpp puts a space before every stretch of text that starts the input
    or follows a special token, then writes every space as "▁". A `tokenizers` normalizer runs on
    exactly those stretches, so Prepend("▁") there is llama.cpp's rule; it also keeps a text's
    own leading space (" hi" is "▁▁hi"), as SentencePiece does.
    NOTE: transformers 5 departs from llama.cpp and SentencePiece in two places. On Llama-style
    files it prefixes only the start of the input and drops the text's own leading space (its
    decode(encode(" hi")) is "hi"). On Gemma it spells the user-defined runs of spaces with "▁"
    and lets merges build them, which splits a run of more than 31 spaces differently (40 are
    16 + 24 there, 31 + 9 in llama.cpp). inferno follows llama.cpp.
    """
    from tokenizers import decoders, models, normalizers
    from tokenizers import Tokenizer as HFTokenizer

    scores = _array(meta, "scores", float, source)
    if scores is None or len(scores) != len(tokens):
        raise InfernoError(f"{source}: the GGUF SentencePiece vocabulary has no score per token "
                           f"(tokenizer.ggml.scores)")
    scores = [float(s) for s in scores]  # plain floats sort fast, whatever the reader gave
    vocab = dict(zip(tokens, range(len(tokens))))
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=cached_merges(tokens, scores, vocab), fuse_unk=True,
                                byte_fallback=True,
                                unk_token=tokens[unk] if _valid_id(unk, tokens) else None))
    spaces = [normalizers.Replace(" ", "\u2581")]
    strip = []
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        spaces.insert(0, normalizers.Prepend("\u2581"))
        strip = [decoders.Strip(" ", 1, 0)]  # the prefix's space, once, at the start
    hf.normalizer = normalizers.Sequence(spaces)
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), *strip])
    return hf


def _merges(tokens: list, scores, vocab: dict) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best-scored whole first; ties go to the longer
    left part, then the longer right part, then the earlier token (transformers' order, so ids
    match its tokenizer on the rare equal-score merges too)."""
    found = []  # (score, len(left), len(right), left, right), in token order
    for token, score in zip(tokens, scores):
        n = len(token)
        for k in range(1, n):
            left = token[:k]
            if left in vocab:
                right = token[k:]
                if right in vocab:
                    found.append((score, k, n - k, left, right))
    found.sort(key=lambda m: m[:3], reverse=True)  # stable: ties keep token order
    return [(left, right) for *_, left, right in found]


# Vocabularies at least this big keep their merges in inferno's cache (Gemma 3's 262k tokens
# take ~0.8 s to split, their 515k merges ~0.06 s to read back); smaller ones split in a blink.
CACHE_MERGES_FROM = 32768
MERGES_VERSION = b"inferno spm merges 1"  # changes whenever _merges' rule or order does


def cached_merges(tokens: list, scores: list, vocab: dict) -> list[tuple[str, str]]:
    """`_merges`, computed once per vocabulary and kept as token-id pairs under inferno's cache
    (tokenizers/), named by a hash of the tokens, their scores and the rule's version. A cache
    that cannot be read or written is computed around, never an error."""
    if len(tokens) < CACHE_MERGES_FROM:
        return _merges(tokens, scores, vocab)
    from inferno.paths import cache_dir
    key = hashlib.blake2b(MERGES_VERSION, digest_size=20)
    key.update("\0".join(tokens).encode("utf-8", "surrogatepass"))
    key.update(np.asarray(scores, np.float64).tobytes())
    path = cache_dir() / "tokenizers" / f"{key.hexdigest()}.merges.npy"
    try:
        ids = np.load(path, allow_pickle=False)
        if ids.dtype == np.int32 and ids.ndim == 2 and ids.shape[1] == 2 and \
                (ids.size == 0 or (ids.min() >= 0 and ids.max() < len(tokens))):
            return [(tokens[a], tokens[b]) for a, b in ids.tolist()]
    except (OSError, ValueError, EOFError):
        pass  # not there yet, or not whole: computed again below
    merges = _merges(tokens, scores, vocab)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as f:
            np.save(f, np.array([(vocab[a], vocab[b]) for a, b in merges], np.int32).reshape(-1, 2))
        os.replace(partial, path)  # readers see the whole file or none
    except OSError:
        with contextlib.suppress(OSError):  # a full disk leaves no partial file behind
            partial.unlink(missing_ok=True)
    return merges


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
