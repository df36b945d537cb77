"""From a name to a loaded checkpoint: aliases, the hub and the download cache (resolve.py), a
GGUF's metadata and tensors read as inferno's config, weights and tokenizer (gguf.py), a Hugging
Face folder (loader.py), and what both give the engine (checkpoint.py)."""
