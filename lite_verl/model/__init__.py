"""Models: loading a model and its tokenizer, tiny models made on the spot, GGUF import."""
