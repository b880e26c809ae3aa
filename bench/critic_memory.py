"""Benchmark: parameter bytes of actor + reference + critic with LoRA (one shared base) vs actor alone.

    python -m bench.critic_memory

Random-init models (no download): lite-verl's tiny Qwen2 and a Qwen2.5-0.5B-shaped Qwen2 in bf16.
Counts distinct parameter storage (shared tensors once). The reference policy is the base with the
adapter disabled, so it costs nothing; the critic is a second LoRA adapter plus a value head.
"""

from __future__ import annotations

import torch

from bench.results import REPORT, append, render
from lite_verl.config import CriticConfig, TrainConfig
from lite_verl.train.lora import LoraBackend

QWEN25_05B = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
)  # fmt: skip


def measure(name: str, base: torch.nn.Module) -> None:
    base_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    backend = LoraBackend(base, TrainConfig(), torch.device("cpu"), seed=0)
    actor = backend.parameter_bytes()
    backend.enable_critic(CriticConfig())
    both = backend.parameter_bytes()
    cmd = "python -m bench.critic_memory"
    settings = "LoRA r=16 on q,k,v,o,gate,up,down; critic = 2nd adapter + value head"
    for metric, value in [
        ("base_param_bytes", base_bytes),
        ("actor_and_reference_param_bytes", actor),
        ("actor_reference_critic_param_bytes", both),
        ("critic_added_bytes", both - actor),
        ("critic_added_over_base", (both - actor) / base_bytes),
        ("separate_critic_model_would_add_bytes", base_bytes + (both - actor)),
    ]:
        unit = "ratio" if metric.endswith("over_base") else "bytes"
        append("critic_memory", name, settings, metric, float(value), unit, cmd)
        print(
            f"{name:<32} {metric:<40} {value:,.4f}"
            if unit == "ratio"
            else f"{name:<32} {metric:<40} {value:,}"
        )


def main() -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from lite_verl.model.tiny import resolve_tiny

    measure("tiny:qwen2 (fp32)", AutoModelForCausalLM.from_pretrained(resolve_tiny("tiny:qwen2")))
    config = Qwen2Config(**QWEN25_05B)
    measure(
        "Qwen2.5-0.5B shape (bf16, random)", AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    )
    REPORT.write_text(render())


if __name__ == "__main__":
    main()
