"""Shipping a trained policy: GGUF files for llama.cpp / Ollama / LM Studio and a push to the Hugging Face Hub."""
