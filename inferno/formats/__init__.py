"""What weights and cache rows are, as data: GGML's block types and QuantTensor (quant.py), the
KV cache's element types (cache_types.py). No kernel is imported here: the file readers, the
Backend contract and every backend share these."""
