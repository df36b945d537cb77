"""Tiny random models for tests, written the way a user's model folder is: transformers'
`save_pretrained` (config.json, model.safetensors) plus a small byte-level BPE tokenizer with a
chat template. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

# A ChatML template in the Qwen3 manner: a system turn if given, and when thinking is switched
# off, an empty think block after the assistant header.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
CORPUS = [
    "The capital of France is Paris. The capital of Germany is Berlin.",
    "Once upon a time there was a baker who baked bread every morning.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Symbols: !?.,;:()[]{}<>",
    "Café, naïve, résumé; 東京 と 大阪; emoji 🙂🔥 and tabs\tand  double  spaces.",
    "Attention is all you need: queries, keys and values, softmax and heads.",
]


def make_tokenizer(folder: Path, vocab_size: int = 400, bos: bool = False, *, specials=(),
                   chat_template: str = CHAT_TEMPLATE):
    """Train a byte-level BPE on CORPUS and save it with transformers' fast tokenizer wrapper.
    `specials`: more special tokens, added after the trained vocabulary (gpt-oss's harmony
    tags, say), with the `chat_template` that writes them."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    if bos:  # Llama style: raw prompts start with <s>
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if specials:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>" if bos else None,
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return fast


def make_model(folder: Path, arch: str = "qwen3", *, hidden: int = 64, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, head_dim: int | None = None,
               intermediate: int = 96, tied: bool = False, dtype: str = "float32",
               max_positions: int = 512, rope_theta: float = 10000.0, seed: int = 0,
               bos: bool = False, init_std: float = 0.15, **extra) -> Path:
    """A random model of `arch` (qwen3, llama, qwen2, gemma3; qwen3_moe, mixtral and gpt_oss, whose
    experts `extra` sizes: num_experts / num_local_experts, num_experts_per_tok...) saved into
    `folder`, with a tokenizer; `extra` goes to the transformers config as is (rope_scaling,
    sliding_window...)."""
    import torch
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder, bos=bos)
    common = dict(vocab_size=len(tok) + 8, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads,
                  intermediate_size=intermediate, max_position_embeddings=max_positions,
                  tie_word_embeddings=tied, rope_theta=rope_theta, rms_norm_eps=1e-6,
                  eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    if head_dim is not None:
        common["head_dim"] = head_dim
    if arch == "llama":
        common["bos_token_id"] = tok.convert_tokens_to_ids("<s>")
    torch.manual_seed(seed)
    config_cls, model_cls = {
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
        "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
        "gpt_oss": ("GptOssConfig", "GptOssForCausalLM"),
    }[arch]
    if arch == "gpt_oss":  # its RoPE (YaRN by default) lives in rope_parameters, with the base
        common.pop("rope_theta")
    config = getattr(transformers, config_cls)(**common, **extra)
    model = getattr(transformers, model_cls)(config)
    # Random init is N(0, 0.02): widen it (init_std) so logits differ by more than float noise,
    # and give the norms non-unit weights so a missing norm would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("sinks"):  # logits beside the scores: large enough to move them
                p.normal_(0.0, 1.5)
            else:
                p.normal_(0.0, init_std)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    return folder
