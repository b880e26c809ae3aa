"""Import a GGUF file (llama.cpp's format, which many hobbyists hold) as a normal Hugging Face model dir.

    lite-verl import-gguf model.Q4_1.gguf OUT_DIR [--dtype bfloat16]
    model.path: ~/models/model.Q4_1.gguf      # imported on first use into LITE_VERL_CACHE/gguf/, then reused

transformers dequantizes GGUF on load but refuses to `save_pretrained` such a model, so the weights
are copied into a clean model built from the same config (without its quantization_config).
transformers' GGUF tokenizer ignores the file's `tokenizer.ggml.add_bos_token` (Gemma's GGUF sets it, and
Gemma without <bos> degenerates), so the importer carries that flag (and add_eos_token) into the saved
tokenizer: its post-processor adds the token, and tokenizer_config.json says so. The tokenizer transformers
builds must also split text as the model was trained to: before 5.19 it built Gemma's (a merges tokenizer) as a
Unigram that splits 'Question' into 'Qu' 'est' 'ion' (a model fed such ids answers nothing right), so the import
checks that the vocabulary's own entries come back whole and refuses otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

from lite_verl.errors import MissingDependency, ModelError

# bump when the import below changes, so cached imports are redone (2: the tokenizer check)
IMPORT_VERSION = 2
WHOLE_WORDS_MIN = 0.95  # share of vocabulary words a sound tokenizer keeps whole (Gemma, SmolLM2: 0.999-1.0;
# Gemma's under transformers 5.17: 0.64)
WORDS_CHECKED = 2000


def import_gguf(gguf_file: str | Path, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lite_verl.device import torch_dtype
    from lite_verl.model.plain import plain_copy
    from lite_verl.run.files import atomic_directory

    src, out = Path(gguf_file), Path(out_dir)
    if not src.is_file():
        raise ModelError(f"{src} does not exist; give the path of a .gguf file")
    if importlib.util.find_spec("gguf") is None:
        raise MissingDependency("gguf", "gguf", "reading GGUF files")
    folder, name = str(src.parent), src.name
    try:
        kind, flags = tokenizer_fields(src)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        check_word_split(tokenizer, src, kind)  # before the weights: dequantizing takes minutes on a laptop
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, OSError, KeyError) as e:
        raise ModelError(
            f"{src}: transformers cannot read this GGUF file ({type(e).__name__}: {e})"
        ) from None
    for flag, value in flags.items():
        setattr(tokenizer, flag, value)  # TokenizersBackend: rebuilds the post-processor
    clean = plain_copy(loaded, AutoConfig.from_pretrained(folder, gguf_file=name)).to(torch_dtype(dtype))
    with atomic_directory(out) as tmp:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if flags:  # for readers that go by tokenizer_config.json (transformers 4.x, vLLM's own checks)
            tok_config = tmp / "tokenizer_config.json"
            tok_config.write_text(json.dumps({**json.loads(tok_config.read_text()), **flags}, indent=2))
    return out


def check_word_split(tokenizer, src: Path, kind: str) -> None:
    """Refuse a tokenizer that splits its own vocabulary's words: the model never saw such ids. `kind`: the
    file's tokenizer.ggml.model."""
    import transformers

    whole, broken = words_kept_whole(tokenizer, merges_file=kind in MERGES_MODELS)
    if whole >= WHOLE_WORDS_MIN:
        return
    word, pieces = broken
    raise ModelError(
        f"{src}: the tokenizer transformers {transformers.__version__} builds from this file splits "
        f"{1 - whole:.0%} of its own vocabulary's words (e.g. {word!r} -> {' '.join(map(repr, pieces))}), "
        "so the model would read ids it was never trained on; upgrade transformers "
        "(pip install -U 'transformers>=5.19') and import again"
    )


def words_kept_whole(
    tokenizer, limit: int = WORDS_CHECKED, merges_file: bool = False
) -> tuple[float, tuple[str, list[str]]]:
    """Of the first `limit` multi-character, non-special vocabulary entries, the share the tokenizer's model
    builds back into that one entry (the model alone, past the normalizer and pre-tokenizer: SentencePiece
    vocabularies hold word-inner pieces that never start a word, and byte-level ones pieces a pre-tokenizer
    splits); and the first one it splits, with its pieces. Checked: a BPE model, and a Unigram one built for
    a file whose tokenizer merges (`merges_file`: llama.cpp's "llama"/"gpt2" kinds; transformers 5.17 built
    Gemma's that way). 1.0 otherwise (a real Unigram vocabulary need not rebuild every entry)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    kind = type(model).__name__ if model is not None else ""
    if not (kind == "BPE" or (kind == "Unigram" and merges_file)) or getattr(model, "ignore_merges", False):
        return 1.0, ("", [])  # ignore_merges (Llama 3): a whole-word entry is taken as it is, merges unused
    special = set(tokenizer.all_special_ids)
    checked, split, first = 0, 0, ("", [])
    for i in range(len(tokenizer)):
        piece = tokenizer.convert_ids_to_tokens(i)
        if i in special or not piece or len(piece) < 2 or piece.startswith("<"):
            continue  # specials and byte-fallback tokens (<0x0A>)
        pieces = [t.value for t in model.tokenize(piece)]
        checked += 1
        if pieces != [piece]:
            split += 1
            first = first if first[0] else (piece, pieces)
        if checked == limit:
            break
    return 1 - split / max(checked, 1), first


# GGUF tokenizer.ggml.model kinds that tokenize by merges (SentencePiece BPE, byte-level BPE); "t5" is a Unigram
MERGES_MODELS = ("llama", "gpt2")


def tokenizer_fields(gguf_file: Path) -> tuple[str, dict[str, bool]]:
    """From one read of the file's metadata: its tokenizer.ggml.model ("llama", "gpt2", "t5"...; '' when
    absent) and {add_bos_token, add_eos_token}, the ones it sets."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf_file)
    model = reader.get_field("tokenizer.ggml.model")
    flags = {}
    for flag in ("add_bos_token", "add_eos_token"):
        field = reader.get_field(f"tokenizer.ggml.{flag}")
        if field is not None:
            flags[flag] = bool(field.contents())
    return (str(model.contents()) if model is not None else ""), flags


def imported_gguf(gguf_file: Path, dtype: str) -> Path:
    """model.path=FILE.gguf: the HF directory imported from it, cached under LITE_VERL_CACHE/gguf/ and keyed by
    the file's path, size and modification time (and the dtype), so an edited or replaced file is imported
    again."""
    from lite_verl.model.tiny import cache_dir

    src = gguf_file.expanduser().resolve()
    stat = src.stat()
    ident = json.dumps([str(src), stat.st_size, stat.st_mtime_ns, dtype, IMPORT_VERSION])
    out = cache_dir() / "gguf" / f"{src.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"
    if not (out / "config.json").is_file():
        print(f"lite-verl: importing {src.name} into {out} (once; later runs reuse it)", file=sys.stderr)
        import_gguf(src, out, dtype)
    return out
