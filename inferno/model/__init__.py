"""Model definition and everything around it: config, weights, tokenizer, cache, sampling."""
