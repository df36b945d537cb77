"""Tokenizer: a `tokenizers` Tokenizer plus the model's chat template and special tokens.

Encoding and decoding are the `tokenizers` library's; streaming goes through its DecodeStream,
which holds back bytes until they form whole UTF-8 characters, so a multi-byte character split
across tokens is never printed half-formed. The chat template is rendered with jinja2 in the
same sandboxed environment transformers uses, so a prompt is byte-identical to
`apply_chat_template`'s.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

from inferno.errors import InfernoError


class Tokenizer:
    def __init__(self, tokenizer: HFTokenizer, *, chat_template: str | None = None,
                 special_tokens: dict[str, str] | None = None, eos_ids=()):
        self.hf = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})  # bos_token, eos_token, ... -> text
        ids = [tokenizer.token_to_id(self.special_tokens["eos_token"])] if "eos_token" in self.special_tokens else []
        self.eos_ids = tuple(dict.fromkeys(int(i) for i in list(eos_ids) + ids if i is not None))

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; `add_special_tokens` lets the tokenizer's post-processor add BOS (raw
        prompts). Chat prompts are encoded without: the template writes its own special tokens."""
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def stream(self, skip_special_tokens: bool = True) -> "StreamDecoder":
        """A streaming decoder; `skip_special_tokens` False keeps special tokens as their text
        (harmony's tags, which its parser reads)."""
        return StreamDecoder(self.hf, skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """Render `messages` with the model's template (extra kwargs reach the template, e.g.
        enable_thinking=False for Qwen3)."""
        if not self.chat_template:
            raise InfernoError("this model has no chat template: pass --raw to send the prompt as is")
        import jinja2

        template = _compile(self.chat_template)
        try:
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   **self.special_tokens, **kwargs)
        except jinja2.TemplateError as e:  # raise_exception() in the template, or a bad template
            raise InfernoError(f"the model's chat template refused these messages: {e}") from None

    @classmethod
    def from_folder(cls, folder: Path, eos_ids=()) -> "Tokenizer":
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise InfernoError(f"{folder}: no tokenizer.json (a model folder holds config.json, "
                               f"*.safetensors and tokenizer.json)")
        hf = HFTokenizer.from_file(str(path))
        config = read_json(folder / "tokenizer_config.json")
        special = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(key)
            if isinstance(value, dict):  # transformers 4.x AddedToken spelling
                value = value.get("content")
            if value:
                special[key] = value
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the "default" one is the chat template
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_file = folder / "chat_template.jinja"  # transformers 5 writes it beside the config
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        return cls(hf, chat_template=template, special_tokens=special, eos_ids=eos_ids)


class StreamDecoder:
    """Token ids in, printable text out: `step` returns "" while a character is incomplete."""

    def __init__(self, tokenizer: HFTokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._tokenizer, int(token_id)) or ""


def read_json(path: Path) -> dict:
    """A JSON file as a dict; {} when the file is absent."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InfernoError(f"{path}: not valid JSON ({e})") from None


@lru_cache(maxsize=8)
def _compile(source: str):
    # The environment transformers renders chat templates in: sandboxed, trim/lstrip blocks,
    # loop controls, a tojson that keeps non-ASCII, raise_exception and strftime_now.
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise InfernoError(f"the model's chat template does not parse ({e}); pass --raw to skip it") from None
