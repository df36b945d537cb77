"""What weights and cache rows are, and the files that hold them, as data: GGML's block types and
QuantTensor (quant.py), the KV cache's element types (cache_types.py), the checked GGUF reader
(gguf_file.py) and safetensors folders (safetensors.py). No kernel, model or tokenizer is
imported here: the loaders, the Backend contract and every backend share these."""
