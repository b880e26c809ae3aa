"""Rollout engines behind one Protocol. Engines load lazily: `make_rollout_engine` imports only the one asked for."""
