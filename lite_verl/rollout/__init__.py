"""Rollout: sample responses to prompts with the current policy, behind one Protocol (base.RolloutEngine).

`factory.build_engine` builds the engine a config asks for and imports only that one (vLLM and AutoAWQ
load only for rollout.engine=vllm): hf.py (transformers generate on the trained model), lockstep.py
(the same over a sharded multi-rank trainer), vllm_engine.py (a vLLM worker process: vllm_start.py
starts it, vllm_worker.py runs in it, vllm_compat.py holds what differs between vLLM versions).
"""
