"""model.path by Hub id and by .gguf file, all offline: a real Hugging Face cache layout built around the tiny
model (models--org--name/blobs, snapshots/<sha>/, refs/main), read by huggingface_hub itself."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL

from lite_verl.config import ModelConfig, load_config
from lite_verl.errors import ModelError
from lite_verl.model.hub import has_weights, parse_hub_id, wanted_files
from lite_verl.model.load import model_provenance, resolve_model_path

MAIN_SHA = "a" * 40
DEV_SHA = "b" * 40


def add_snapshot(cache: Path, repo: str, sha: str, src: Path, refs: tuple[str, ...]) -> Path:
    """The files of `src` as the Hub's cache stores them: content-addressed blobs, a snapshot of relative
    symlinks to them, and refs/<branch> holding the commit."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        data = f.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (root / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(sha)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, tiny_dir, monkeypatch) -> Path:
    """HF_HUB_CACHE in tmp with org/tiny at main (MAIN_SHA) and at branch dev (DEV_SHA); offline."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    add_snapshot(cache, "org/tiny", MAIN_SHA, tiny_dir, ("main",))
    add_snapshot(cache, "org/tiny", DEV_SHA, tiny_dir, ("dev",))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read at import; the env is for subprocesses
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_the_cache_layout_is_the_real_one(hub_cache):
    from huggingface_hub import scan_cache_dir, snapshot_download

    assert (
        Path(snapshot_download("org/tiny", local_files_only=True))
        == hub_cache / "models--org--tiny" / "snapshots" / MAIN_SHA
    )
    repo = next(r for r in scan_cache_dir(hub_cache).repos if r.repo_id == "org/tiny")
    assert {r.commit_hash for r in repo.revisions} == {MAIN_SHA, DEV_SHA} and repo.refs[
        "dev"
    ].commit_hash == DEV_SHA


def test_hub_id_resolves_to_the_cached_snapshot_offline(hub_cache):
    snapshots = hub_cache / "models--org--tiny" / "snapshots"
    assert resolve_model_path(ModelConfig(path="org/tiny")) == snapshots / MAIN_SHA
    assert resolve_model_path(ModelConfig(path="org/tiny@dev")) == snapshots / DEV_SHA
    assert resolve_model_path(ModelConfig(path="org/tiny", revision="dev")) == snapshots / DEV_SHA
    assert resolve_model_path(ModelConfig(path="org/tiny", revision=DEV_SHA)) == snapshots / DEV_SHA
    assert model_provenance(ModelConfig(path="org/tiny@dev")) == {
        "path": "org/tiny@dev", "local_dir": str(snapshots / DEV_SHA), "repo_id": "org/tiny",
        "revision": "dev", "commit": DEV_SHA,
    }  # fmt: skip
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(snapshots / MAIN_SHA).eos_token == "<|im_end|>"  # symlinks load


def _one_line_error(cfg: ModelConfig, *expected: str) -> None:
    with pytest.raises(ModelError) as e:
        resolve_model_path(cfg)
    assert "\n" not in str(e.value) and all(x in str(e.value) for x in expected), str(e.value)


def test_offline_and_not_cached_is_one_line_naming_the_fetch_command(hub_cache):
    _one_line_error(ModelConfig(path="org/missing"), "model.path='org/missing'", "`hf download org/missing`",
                    "HF_HUB_OFFLINE")  # fmt: skip
    _one_line_error(ModelConfig(path="org/tiny@v2"), "`hf download org/tiny --revision v2`")
    _one_line_error(ModelConfig(path="org/tiny@dev", revision="main"), "give the revision once")
    _one_line_error(ModelConfig(path="/no/such/model"), "model.path='/no/such/model' does not exist")
    _one_line_error(ModelConfig(path=str(hub_cache), revision="dev"), "model.revision='dev' is for a Hub id")


def test_a_snapshot_without_its_weights_is_not_taken_as_cached(hub_cache, tiny_dir, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((tiny_dir / "config.json").read_text())
    add_snapshot(hub_cache, "org/partial", MAIN_SHA, partial, ("main",))
    _one_line_error(ModelConfig(path="org/partial"), "`hf download org/partial`")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text("{}")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "m-1.safetensors",
                                                                                      "b": "m-2.safetensors"}}))  # fmt: skip
    (sharded / "m-1.safetensors").write_bytes(b"x")
    assert not has_weights(sharded)
    (sharded / "m-2.safetensors").write_bytes(b"x")
    assert has_weights(sharded)


def test_only_what_a_causal_lm_needs_is_downloaded():
    repo = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "merges.txt",
            "tokenizer.model", "chat_template.jinja", "modeling_x.py", "README.md", ".gitattributes",
            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
            "consolidated.safetensors", "pytorch_model.bin", "onnx/model.onnx", "onnx/config.json",
            "model.Q4_K_M.gguf", "flax_model.msgpack", "tf_model.h5", "original/params.json"]  # fmt: skip
    assert wanted_files(repo) == sorted([
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "merges.txt",
        "tokenizer.model", "chat_template.jinja", "modeling_x.py", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json",
    ])  # fmt: skip
    bins = ["config.json", "pytorch_model.bin", "training_args.bin", "vocab.txt"]
    assert wanted_files(bins) == ["config.json", "pytorch_model.bin", "vocab.txt"]


def test_what_counts_as_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert parse_hub_id("org/name") == ("org/name", "")
    assert parse_hub_id("Qwen/Qwen2.5-1.5B-Instruct@v1.0") == ("Qwen/Qwen2.5-1.5B-Instruct", "v1.0")
    assert parse_hub_id("org/name", "dev") == ("org/name", "dev")
    for local in (
        "models/mine",
        "models/typo",  # a missing path in a folder here: "does not exist", not a failed download
        "/abs/dir",
        "./org/name",
        "~/org",
        "a/b/c",
        "tiny:qwen2",
        "org/m.gguf",
        "name",
    ):
        assert parse_hub_id(local) is None, local


def test_reward_model_accepts_a_hub_id(hub_cache):
    cfg = load_config("laptop", None, ["reward.model=org/tiny"])  # validation lets a Hub id through
    assert cfg.reward.model == "org/tiny"


def test_training_from_a_hub_id_with_the_network_off(hub_cache, tmp_path):
    """The real CLI in a subprocess: HF_HUB_CACHE and HF_HUB_OFFLINE=1 from the environment only."""
    sets = [x for kv in [*SMALL, "trainer.total_steps=2", "model.path=org/tiny"] for x in ("--set", kv)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "lite_verl", "train", "--run-dir", "run", *sets], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    run = tmp_path / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if "reward/mean" in m] == [1, 2]
    assert "model:\n  path: org/tiny\n" in (run / "config.yaml").read_text()  # what the user typed
    model = json.loads((run / "env.json").read_text())["model"]
    assert model["repo_id"] == "org/tiny" and model["commit"] == MAIN_SHA  # and what it resolved to


# ----------------------------------------------------------------------------------------------------------
# model.path=FILE.gguf: a GGUF written from the tiny llama, imported once, add-BOS carried over
# ----------------------------------------------------------------------------------------------------------


def write_gguf(src: Path, out: Path, add_bos: bool, merges_kept: float = 1.0) -> None:
    """The tiny llama at `src` as llama.cpp's converter writes it (q/k rows permuted, byte-level BPE);
    `merges_kept` < 1 writes only the first part of its merges, as a converter that loses some would."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    c = model.config
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = {**tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok["added_tokens"]}}
    special = {a["id"] for a in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_token_list(sorted(vocab, key=vocab.__getitem__))
    w.add_token_types([3 if i in special else 1 for i in range(len(vocab))])
    merges = tok["model"]["merges"]
    w.add_token_merges(
        [m if isinstance(m, str) else " ".join(m) for m in merges[: int(len(merges) * merges_kept)]]
    )
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    w.add_add_bos_token(add_bos)
    w.add_chat_template(json.loads((src / "tokenizer_config.json").read_text()).get("chat_template") or "")

    def permute(t, heads):
        return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    names = {"attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}  # fmt: skip
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(
            f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads)
        )
        w.add_tensor(
            f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads)
        )
        for g, h in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[p + h + ".weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None, reason="gguf is not installed: pip install gguf"
)
def test_a_gguf_file_is_imported_once_with_its_add_bos_setting(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lite_verl.model.tiny import resolve_tiny

    src = resolve_tiny("tiny:llama")
    gguf_file = tmp_path / "tiny.gguf"
    write_gguf(src, gguf_file, add_bos=True)
    cfg = ModelConfig(path=str(gguf_file))
    out = resolve_model_path(cfg)
    assert resolve_model_path(cfg) == out and out.parent.name == "gguf"  # cached: imported once
    tok, ref_tok = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(src)
    ids = ref_tok("12+3=15")["input_ids"]
    assert tok("12+3=15")["input_ids"] == [tok.bos_token_id, *ids]  # transformers alone drops the flag
    assert json.loads((out / "tokenizer_config.json").read_text())["add_bos_token"] is True
    x = torch.tensor([ids])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(src)(x).logits
        got = AutoModelForCausalLM.from_pretrained(out)(x).logits
    assert torch.allclose(got, want, atol=1e-5)
    os.utime(gguf_file, ns=(1, 1))  # a changed file is imported again
    assert resolve_model_path(cfg) != out
    _one_line_error(
        ModelConfig(path=str(tmp_path / "nope.gguf")), "does not exist; give the path of a .gguf file"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None, reason="gguf is not installed: pip install gguf"
)
def test_a_gguf_whose_tokenizer_splits_its_own_words_is_refused_and_nothing_is_written(tmp_path):
    """transformers before 5.19 rebuilt Gemma's merges in the wrong order and its ids meant nothing to the
    model (greedy accuracy 0 on a GPU where the CPU's import scored 0.14); here the file lacks half its merges."""
    from lite_verl.model.gguf import import_gguf
    from lite_verl.model.tiny import resolve_tiny

    gguf_file, out = tmp_path / "tiny.gguf", tmp_path / "imported"
    write_gguf(resolve_tiny("tiny:llama"), gguf_file, add_bos=False, merges_kept=0.5)
    with pytest.raises(ModelError) as e:
        import_gguf(gguf_file, out)
    message = str(e.value)
    assert (
        "of its own vocabulary's words (e.g." in message and "pip install -U 'transformers>=5.19'" in message
    )
    assert "\n" not in message and not out.exists() and list(tmp_path.iterdir()) == [gguf_file]


def test_online_a_missing_model_is_downloaded_once_then_read_from_the_cache(hub_cache, tiny_dir, monkeypatch):
    """The Hub stands in: model_info lists the repo, snapshot_download fills the cache as the real one does."""
    import types

    import huggingface_hub
    from huggingface_hub import constants

    calls: list[list[str]] = []
    files = [p.name for p in tiny_dir.iterdir()] + ["onnx/model.onnx", "model.gguf", "README.md"]

    def model_info(self, repo, revision=None):
        return types.SimpleNamespace(siblings=[types.SimpleNamespace(rfilename=f) for f in files])

    def snapshot_download(repo, revision=None, allow_patterns=None, local_files_only=False):
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        calls.append(list(allow_patterns))
        return str(add_snapshot(hub_cache, repo, "c" * 40, tiny_dir, ("main",)))

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    path = resolve_model_path(ModelConfig(path="org/new"))
    assert path.name == "c" * 40 and calls == [sorted(p.name for p in tiny_dir.iterdir())]
    monkeypatch.undo()  # the real snapshot_download, offline: the cached snapshot, no second download
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve_model_path(ModelConfig(path="org/new")) == path


def test_online_an_unreachable_hub_is_one_line(hub_cache, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: connection refused
    _one_line_error(ModelConfig(path="org/missing"), "downloading it failed", "`hf download org/missing`")
    assert resolve_model_path(ModelConfig(path="org/tiny")).name == MAIN_SHA  # cached: no network needed
