"""Tiny random-init causal LMs with a tokenizer trained on the spot: no download, loadable by from_pretrained.

    lite-verl make-tiny-model DIR [--arch qwen2|llama] [--seed 0]

The tokenizer is a byte-level BPE trained with `tokenizers` on the built-in tasks' text, with a
ChatML chat template (<|im_start|>role ... <|im_end|>). head_dim is 32 so that vLLM's CPU backend can
load the same model. `model.path: tiny:qwen2` builds one into the cache (LITE_VERL_CACHE or
~/.cache/lite-verl) the first time and reuses it: same arch, sizes and seed -> same weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_VERSION = 2  # bump when the recipe below changes, so cached models are rebuilt


@dataclass(frozen=True)
class TinySpec:
    arch: str = "qwen2"  # qwen2 | llama
    vocab_size: int = 512  # BPE vocabulary incl. special tokens
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4  # head_dim = hidden_size / num_heads = 32
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 1024
    # initializer_range. With the usual 0.02 the tied embeddings are so short that no hidden state can
    # push a logit above ~2.5 (|h| = sqrt(d) after the final norm), so LoRA cannot sharpen the policy
    # and RL sees a flat reward; 0.2 leaves the start near-uniform (entropy ~3.9 nats) but learnable.
    init_std: float = 0.2
    tie_embeddings: bool = True
    seed: int = 0


def train_tokenizer(vocab_size: int, seed: int):
    """A byte-level BPE over the built-in tasks' text, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from lite_verl.data.tasks import tokenizer_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = tokenizer_corpus(seed)
    corpus += [f"<|im_start|>{r}\n" for r in ("system", "user", "assistant")]
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def _model_config(spec: TinySpec, tokenizer):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=spec.tie_embeddings,
        initializer_range=spec.init_std,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if spec.arch == "qwen2":
        return Qwen2Config(**common)
    if spec.arch == "llama":
        return LlamaConfig(**common, head_dim=spec.hidden_size // spec.num_heads)
    raise ValueError(f"unknown tiny arch {spec.arch!r}; use qwen2 or llama")


def make_tiny_model(out_dir: str | Path, spec: TinySpec | None = None) -> Path:
    """Write a random-init model + tokenizer to out_dir (atomically: a temp dir renamed at the end)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from lite_verl.run.files import atomic_directory

    spec = spec or TinySpec()
    out = Path(out_dir)
    tokenizer = train_tokenizer(spec.vocab_size, spec.seed)
    config = _model_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "lite_verl_tiny.json").write_text(json.dumps({**asdict(spec), "version": TINY_VERSION}))
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("LITE_VERL_CACHE", Path.home() / ".cache" / "lite-verl"))


def resolve_tiny(path: str, **overrides) -> Path:
    """`tiny:qwen2` -> a cached model directory, built on first use."""
    arch = path.split(":", 1)[1] or "qwen2"
    spec = TinySpec(arch=arch, **overrides)
    key = hashlib.sha256(json.dumps({**asdict(spec), "version": TINY_VERSION}).encode()).hexdigest()[:12]
    out = cache_dir() / "tiny" / f"{arch}-{key}"
    if not (out / "config.json").is_file():
        make_tiny_model(out, spec)
    return out
