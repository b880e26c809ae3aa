"""Random-init models with real architectures' shapes, written on the spot (no download), for GPU benchmarks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SHAPES = {  # Qwen2.5 shapes (hidden, intermediate, layers, heads, kv heads, tied embeddings)
    "0.5b": (896, 4864, 24, 14, 2, True),
    "1.5b": (1536, 8960, 28, 12, 2, True),
    "3b": (2048, 11008, 36, 16, 2, True),
    "7b": (3584, 18944, 28, 28, 4, False),
}


def make_model(size: str, root: Path) -> Path:
    """A random bf16 Qwen2.5-{size}-shaped model with lite-verl's tiny tokenizer (ids < 512 < vocab)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from lite_verl.model.tiny import train_tokenizer

    out = root / f"qwen2.5-{size}-random"
    if (out / "config.json").is_file():
        return out
    hidden, inter, layers, heads, kv, tied = SHAPES[size]
    tok = train_tokenizer(512, 0)
    config = Qwen2Config(
        vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied, max_position_embeddings=4096,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=0, rope_theta=1e6,
    )  # fmt: skip
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return out


def bench_model(size: str, root: Path) -> tuple[Path, str]:
    """-> (model dir, label): the Qwen2.5-{size} shape on a GPU; lite-verl's tiny Qwen2 on a CPU, where a
    real shape would take the 2-core CI machine minutes per figure."""
    import torch

    if torch.cuda.is_available():
        return make_model(size, root), f"Qwen2.5-{size} shape (random, bf16)"
    from lite_verl.model.tiny import make_tiny_model

    out = root / "tiny-qwen2"
    if not (out / "config.json").is_file():
        make_tiny_model(out)
    return out, "tiny:qwen2 (random, fp32)"


def in_child(code: str) -> str:
    """The last line `code` prints, run by a child Python: what it allocates on the card goes with it."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def built_model(size: str, root: Path) -> tuple[Path, str]:
    """bench_model in a child process: the caller never touches the card (its peak, or its used memory before
    CUDA starts, is then the run's alone)."""
    path, label = in_child(f"from pathlib import Path; from bench.gpu_models import bench_model; "
                           f"print(*bench_model({size!r}, Path({str(root)!r})), sep='|')").split("|", 1)  # fmt: skip
    return Path(path), label
