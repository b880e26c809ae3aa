"""Benchmark: the GGUF export of a real model, loaded back, against the HF model it came from.

    python -m bench.gguf_roundtrip MODEL_DIR [--quants f16,q8_0,q4_k_m] [--prompts 8] [--tokens 32]

For each quant: lite-verl's GGUF writer (llama.cpp's converter, ship/gguf.py) -> transformers' GGUF loader;
greedy completions of the first N GSM8K-style built-in prompts (chat template applied) compared token by
token with the HF model's, whether the GGUF's tokenizer gives the same prompt ids, the file size and the
conversion time; with llama-cpp-python installed, llama.cpp's own greedy completions of the same prompt ids
too (the only check a k-quant gets: transformers cannot load those). One row per figure to bench/results.jsonl.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.results import append, render


def agreement(got: list[list[int]], want: list[list[int]]) -> float:
    """Mean over prompts of the fraction of positions where the two greedy completions hold the same token."""
    return sum(sum(x == y for x, y in zip(a, b)) / max(len(b), 1) for a, b in zip(got, want)) / len(want)


def llama_cpp_greedy(path: Path, prompts, tokens: int) -> list[list[int]] | None:
    """llama.cpp itself (llama-cpp-python) continuing each prompt's ids greedily; None when it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=str(path), n_ctx=1024, verbose=False, seed=0)
    out = []
    for ids in prompts:
        llm.reset()
        llm.eval(ids[0].tolist())
        got: list[int] = []
        for _ in range(tokens):
            got.append(int(llm.sample(temp=0.0)))
            if got[-1] == llm.token_eos():
                break
            llm.eval([got[-1]])
        out.append(got)
    return out


def greedy(model, prompts, tokens: int) -> list[list[int]]:
    """transformers' greedy completion of each prompt's ids (the new tokens only)."""
    import torch

    with torch.no_grad():
        return [
            model.generate(ids, max_new_tokens=tokens, do_sample=False)[0, ids.shape[1] :].tolist()
            for ids in prompts
        ]


def convert(src: Path, out: Path, quant: str, prompts, tokens: int):
    """Write the GGUF into `out`; -> (its path, conversion s, llama.cpp's completions or None, the GGUF
    loaded by transformers or None for a k-quant, its tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lite_verl.ship.gguf import KQUANTS, write_gguf

    start = time.perf_counter()
    path = write_gguf(src, out, quant, "model")
    convert_s = time.perf_counter() - start
    cpp = llama_cpp_greedy(path, prompts, tokens)
    gg = (
        None
        if quant in KQUANTS
        else AutoModelForCausalLM.from_pretrained(out, gguf_file=path.name, dtype=torch.float32)
    )
    return path, convert_s, cpp, gg, AutoTokenizer.from_pretrained(out, gguf_file=path.name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a HF model directory")
    p.add_argument("--name", default="", help="the model's name in the results (default: the directory)")
    p.add_argument("--quants", default="f16,q8_0")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lite_verl.data.tasks import task_rows
    from lite_verl.ship.gguf import check_quant

    src = Path(args.model)
    name = args.name or src.name
    tok = AutoTokenizer.from_pretrained(src)
    rows = task_rows("arithmetic", args.prompts, seed=0, split="test")
    texts = [
        tok.apply_chat_template(list(r.messages), add_generation_prompt=True, tokenize=False) for r in rows
    ]
    prompts = [tok(t, return_tensors="pt", add_special_tokens=False).input_ids for t in texts]
    want = greedy(AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32), prompts, args.tokens)
    command = "python -m bench.gguf_roundtrip " + " ".join(sys.argv[1:])
    settings = f"{args.prompts} built-in arithmetic prompts (chat template), greedy, {args.tokens} new tokens, CPU fp32"

    def row(metric: str, value: float, unit: str = "fraction") -> None:
        append("gguf", name, settings, metric, value, unit, command)

    for quant in args.quants.split(","):
        quant = check_quant(quant)
        with tempfile.TemporaryDirectory() as out:
            path, convert_s, cpp, gg, gtok = convert(src, Path(out), quant, prompts, args.tokens)
            size = path.stat().st_size / 2**20
        if cpp is not None:
            same = sum(a == b for a, b in zip(cpp, want))
            row(f"{quant}_llama_cpp_identical_completions", same / len(want))
            row(f"{quant}_llama_cpp_token_agreement", agreement(cpp, want))
            print(f"{quant} in llama.cpp: {same}/{len(want)} identical completions, "
                  f"token agreement {agreement(cpp, want):.3f}")  # fmt: skip
        if gg is None:  # transformers cannot load k-quants
            continue
        same_ids = sum(
            gtok(t, add_special_tokens=False).input_ids == ids[0].tolist() for t, ids in zip(texts, prompts)
        )
        got = greedy(gg, prompts, args.tokens)
        same, agree = sum(a == b for a, b in zip(got, want)), agreement(got, want)
        row(f"{quant}_identical_completions", same / len(want))
        row(f"{quant}_token_agreement", agree)
        row(f"{quant}_same_prompt_ids", same_ids / len(texts))
        row(f"{quant}_file_mib", size, "MiB")
        row(f"{quant}_convert_s", convert_s, "s")
        print(f"{quant}: {same}/{len(want)} identical completions, token agreement {agree:.3f}, prompt ids "
              f"{same_ids}/{len(texts)} equal, {size:.1f} MiB, converted in {convert_s:.1f} s")  # fmt: skip
    render()


if __name__ == "__main__":
    main()
