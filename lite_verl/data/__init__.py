"""Prompt data: verl's schema, built-in tasks, GSM8K conversion, and the seeded prompt sampler."""
