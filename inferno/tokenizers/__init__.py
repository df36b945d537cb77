"""Tokenizers: one class over Hugging Face's `tokenizers` with the chat template (tokenizer.py),
built from a tokenizer.json or from a GGUF's vocabulary (gguf_tokenizer.py)."""
