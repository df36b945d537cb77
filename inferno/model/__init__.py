"""The model: its config (config.py: the families, read from a config.json or GGUF metadata), the
forward (decoder.py, through a backend's ops only) and the KV cache (kv_cache.py). No file format,
tokenizer or kernel is known here."""
