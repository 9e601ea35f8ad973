"""The model: a Llama-family decoder, paged attention, tokenizers, the built-in model and the loader."""
