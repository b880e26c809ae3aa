"""Loading the policy's base model and tokenizer, with errors a user can act on.

`model.path` is one of (resolve_model_path turns each into a local directory):
  a Hugging Face causal-LM directory            loaded with the real `from_pretrained`
  a Hub id, org/name[@revision]                 the cached snapshot, downloaded once if missing (hub.py)
  a .gguf file                                  imported once into LITE_VERL_CACHE/gguf/ (gguf.py)
  tiny:qwen2 / tiny:llama                       a random-init model made on the spot (tiny.py)

The controller resolves it once and hands the directory to every process it starts (vLLM, training
followers, the AWQ quantizer); resolving again (export, resume) finds the same cached directory offline.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from lite_verl.config import Config, ModelConfig
from lite_verl.errors import ModelError

REAL_MODEL_HIDDEN = 512  # a hidden size this wide is a real model, not the tiny demo one (64-256)
KINDS = "a local Hugging Face model directory, a Hub id (org/name), a .gguf file or tiny:qwen2"


def check_model_path(cfg: ModelConfig) -> None:
    """model.path names a tiny model, a Hub id, or an existing .gguf file or model directory; else one line.
    Nothing is loaded or downloaded: `lite-verl validate` asks, and resolve_model_path before its work."""
    if cfg.path.startswith("tiny:") or _hub_id(cfg) is not None:
        return
    path = Path(cfg.path).expanduser()
    if cfg.path.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"model.path={cfg.path!r} does not exist; give the path of a .gguf file")
    elif not path.is_dir():
        raise ModelError(f"model.path={cfg.path!r} does not exist; give {KINDS}")


def resolve_model_path(cfg: ModelConfig) -> Path:
    """model.path (with model.revision) -> the local model directory every process loads."""
    if cfg.path.startswith("tiny:"):
        from lite_verl.model.tiny import resolve_tiny

        arch = cfg.path.split(":", 1)[1]
        if arch not in ("qwen2", "llama"):
            raise ModelError(f"model.path={cfg.path!r}: tiny models are tiny:qwen2 or tiny:llama")
        return resolve_tiny(cfg.path)
    check_model_path(cfg)
    path = Path(cfg.path).expanduser()
    hub = _hub_id(cfg)
    if hub is not None:
        from lite_verl.model.hub import resolve_hub

        path = resolve_hub(*hub)
    elif cfg.path.lower().endswith(".gguf"):
        from lite_verl.model.gguf import imported_gguf

        path = imported_gguf(path, cfg.dtype)
    config_file = path / "config.json"
    if not config_file.is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f"; it holds {ggufs[0]}: set model.path to that file" if ggufs else ""
        raise ModelError(
            f"model.path={cfg.path!r} has no config.json; it is not a Hugging Face model directory{hint}"
        )
    check_causal_lm(path)
    return path


def _hub_id(cfg: ModelConfig) -> tuple[str, str] | None:
    """(repo, revision) when model.path names a Hub model; model.revision only goes with one."""
    from lite_verl.model.hub import parse_hub_id

    hub = parse_hub_id(cfg.path, cfg.revision)
    if hub is None and cfg.revision:
        raise ModelError(
            f"model.revision={cfg.revision!r} is for a Hub id (org/name); model.path={cfg.path!r} is not one: "
            "drop model.revision"
        )
    return hub


def model_provenance(cfg: ModelConfig) -> dict[str, Any]:
    """Where the run's model came from, for RUN/env.json: what model.path resolved to and, for a Hub id, the
    commit of the snapshot (model.path=org/name@COMMIT reruns exactly that)."""
    out: dict[str, Any] = {"path": cfg.path}
    if cfg.path.startswith("tiny:"):
        return out
    hub = _hub_id(cfg)
    path = (
        resolve_model_path(cfg) if hub or cfg.path.lower().endswith(".gguf") else Path(cfg.path).expanduser()
    )
    out["local_dir"] = str(path.absolute())
    if hub is not None:
        out.update(repo_id=hub[0], revision=hub[1] or "main", commit=path.name)
    return out


def check_causal_lm(path: Path) -> None:
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    try:
        raw = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError:
        raise ModelError(f"{path}/config.json is not valid JSON") from None
    model_type = raw.get("model_type")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not raw.get("auto_map"):
        raise ModelError(
            f"model.path={str(path)!r} is a {model_type!r} model, not a causal LM transformers can train; "
            "use a decoder-only model (Qwen2, Llama, ...)"
        )
    AutoConfig.from_pretrained(path)


def quant_method(path: Path) -> str | None:
    """The quantization a checkpoint was saved with (its config.json's quantization_config.quant_method:
    bitsandbytes for Unsloth's *-bnb-4bit, awq, gptq, ...), or None for plain weights."""
    try:
        quant = json.loads((path / "config.json").read_text()).get("quantization_config")
    except (OSError, json.JSONDecodeError):
        return None
    return str(quant.get("quant_method") or "unknown") if isinstance(quant, dict) else None


def check_prequantized(path: Path, model_path: str, backend: str, awq_rollout: bool) -> None:
    """A pre-quantized checkpoint trains only as QLoRA (on its bitsandbytes 4-bit weights) and cannot be
    calibrated for AWQ: one line before anything loads, rather than a traceback at the first update."""
    method = quant_method(path)
    if method is None:
        return
    where = f"model.path={model_path!r} is saved pre-quantized ({method})"
    if method != "bitsandbytes":
        raise ModelError(
            f"{where}; lite-verl trains from plain or bitsandbytes 4-bit weights: give the unquantized model"
        )
    if backend != "qlora":
        raise ModelError(f"{where}: train it with --set train.backend=qlora (LoRA on its 4-bit weights), or give the "
                         "unquantized model")  # fmt: skip
    if awq_rollout:
        raise ModelError(f"{where}: AWQ cannot be calibrated from 4-bit weights; set rollout.quantization=none "
                         "(vLLM serves the bitsandbytes checkpoint) or give the unquantized model")  # fmt: skip


def warn_demo_lr(cfg: Config, path: Path) -> None:
    """train.lr's default (3e-3) is the tiny demo model's: a real model at that rate diverges within steps.
    A recipe sets its own; without one, say so once (TRL and verl default to 1e-6, LoRA runs use 1e-5..1e-4)."""
    from lite_verl.config.schema import TrainConfig

    if cfg.recipe or cfg.train.lr != TrainConfig.lr:
        return
    try:
        hidden = int(json.loads((path / "config.json").read_text()).get("hidden_size") or 0)
    except (OSError, ValueError, TypeError):
        return
    if hidden >= REAL_MODEL_HIDDEN:
        print(f"lite-verl: train.lr={cfg.train.lr:g} is the tiny demo model's rate, far too high for {cfg.model.path}; "
              "use a recipe (lite-verl recipes) or --set train.lr=1e-5 (LoRA: up to 1e-4)", file=sys.stderr)  # fmt: skip


def load_tokenizer(path: Path, trust_remote_code: bool = False, chat_template: str = ""):
    """The model's tokenizer, left-padding, with a pad token, and data.chat_template in place of its own."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelError(
            f"model.path={str(path)!r}: cannot load its tokenizer ({e.__class__.__name__})"
        ) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if chat_template:
        tok.chat_template = template_text(chat_template)
    return tok


# the templates data.chat_template names; ChatML as Qwen and SmolLM2 write it
NAMED_TEMPLATES = {
    "chatml": "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
}


def template_text(spec: str) -> str:
    """data.chat_template as Jinja text: a name of NAMED_TEMPLATES, a file, or the text itself."""
    if spec in NAMED_TEMPLATES:
        return NAMED_TEMPLATES[spec]
    if "{" in spec:  # Jinja's {% %} / {{ }}: the template itself
        return spec
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ModelError(f"data.chat_template={spec!r}: not a template name ({', '.join(NAMED_TEMPLATES)}), a file "
                         "or Jinja text; give a .jinja file or the template itself")  # fmt: skip
    return path.read_text()


@contextmanager
def _readable_weights(path: Path) -> Iterator[None]:
    """A truncated or corrupt weights file (safetensors' or torch's error, deep in from_pretrained) is one
    line naming the model and the fix. Out-of-memory and the like pass through."""
    from safetensors import SafetensorError

    try:
        yield
    except (SafetensorError, OSError, EOFError, RuntimeError, ValueError) as e:
        if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
            raise
        first = (str(e).strip().splitlines() or ["no message"])[0][:200]
        raise ModelError(
            f"model.path={str(path)!r}: cannot read its weights ({type(e).__name__}: {first}); the files are "
            "truncated or corrupt: download or export them again"
        ) from None


def load_model(path: Path, cfg: ModelConfig, device: torch.device, nf4: bool = False):
    """The model in cfg.dtype on `device`; nf4=True (train.backend=qlora): every linear layer of the
    decoder stored as bitsandbytes 4-bit NF4 (double-quantized), computing in cfg.dtype; the LM head
    and embeddings stay in cfg.dtype."""
    from transformers import AutoModelForCausalLM

    from lite_verl.device import torch_dtype

    if not nf4:
        with _readable_weights(path):
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch_dtype(cfg.dtype), trust_remote_code=cfg.trust_remote_code
            )
        return model.to(device)
    from transformers import BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch_dtype(cfg.dtype),
    )  # fmt: skip
    with _readable_weights(path):
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype(cfg.dtype), quantization_config=quant, device_map={"": str(device)},
            trust_remote_code=cfg.trust_remote_code,
        )  # fmt: skip
    # On a CPU, bitsandbytes repacks a 4-bit weight into an inference-only layout at its first eval
    # forward, after which training through that layer fails; lite-verl generates and trains with the
    # same layers, so that repacking is turned off.
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model
