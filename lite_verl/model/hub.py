"""Models by Hugging Face Hub id: `org/name` (optionally `org/name@REV` or model.revision) -> a local snapshot.

    lite-verl train --preset 4090x1 --set model.path=Qwen/Qwen2.5-1.5B-Instruct

`huggingface_hub` does the work, so HF_HOME / HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE mean what they
always mean. A snapshot already in the cache is used as it is, without a network call (`hf download ID`
refreshes it); otherwise the files a causal LM needs are downloaded (config, tokenizer, safetensors
weights, or *.bin weights when the repo has no safetensors; no ONNX, GGUF, Flax or TF files), with the
Hub's own progress bars. Offline and not cached is one line naming the command that fetches the model.

The controller resolves model.path once; every other process (vLLM workers, training followers, quantize)
is handed the local directory, and a later resolution of the same id (export, resume) finds the cached
snapshot without the network.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from lite_verl.errors import ModelError, first_line

# org/name, as the Hub spells repo ids (letters, digits, '-', '_', '.'), with an optional @revision
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?:@(?P<rev>[\w./-]+))?$")
# top-level files a causal LM needs besides its weights: configs, tokenizer, chat template, remote code
META_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja", ".py")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def parse_hub_id(path: str, revision: str = "") -> tuple[str, str] | None:
    """(repo id, revision or "") when `path` names a Hub model rather than a local path; None otherwise.
    A path that exists on disk is always local; so is one that starts with '/', '.', '~' or ends in .gguf, and
    one whose first part is a folder here (runs/typo)."""
    if Path(path).expanduser().exists() or path.lower().endswith(".gguf"):
        return None
    if "/" in path and Path(path.split("/", 1)[0]).is_dir():  # runs/typo: a missing path in a local folder
        return None
    m = HUB_ID.match(path)
    if m is None or ".." in m["repo"] or "--" in m["repo"]:
        return None
    rev = m["rev"] or ""
    if rev and revision and rev != revision:
        raise ModelError(
            f"model.path={path!r} names revision {rev!r} but model.revision={revision!r}; give the revision once"
        )
    return m["repo"], rev or revision


def fetch_command(repo: str, revision: str = "") -> str:
    return f"hf download {repo}" + (f" --revision {revision}" if revision else "")


def resolve_hub(repo: str, revision: str = "", key: str = "model.path") -> Path:
    """The local snapshot directory of `repo` at `revision` (default: main), downloaded if not cached."""
    from huggingface_hub import constants

    shown = f"{key}={repo + (f'@{revision}' if revision else '')!r}"
    cached = cached_snapshot(repo, revision)
    if cached is not None:
        return cached
    if constants.HF_HUB_OFFLINE:
        raise ModelError(
            f"{shown} is neither a local directory nor in the Hugging Face cache (HF_HUB_OFFLINE=1); fetch it with "
            f"`{fetch_command(repo, revision)}` (or unset HF_HUB_OFFLINE to download it now)"
        )
    path = _download(repo, revision, shown)
    if not has_weights(path):
        raise ModelError(
            f"{shown}: the download at {path} has no config.json or no weights; see the repo's files"
        )
    return path


def cached_snapshot(repo: str, revision: str = "") -> Path | None:
    """The cached snapshot with config.json and every weight file, or None; never touches the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        # only config.json is named: a snapshot downloaded with other patterns is not "incomplete" for it
        found = snapshot_download(
            repo, revision=revision or None, local_files_only=True, allow_patterns=["config.json"]
        )
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    path = Path(found)
    return path if has_weights(path) else None


def has_weights(path: Path) -> bool:
    """config.json and the weights are there: every shard an index names, or a single weight file."""
    if not (path / "config.json").is_file():
        return False
    for index in WEIGHT_INDEXES:
        if (path / index).is_file():
            try:
                shards = set(json.loads((path / index).read_text())["weight_map"].values())
            except (json.JSONDecodeError, KeyError, AttributeError):
                return False
            return all((path / s).is_file() for s in shards)
    return any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))


def wanted_files(files: list[str]) -> list[str]:
    """The files of a repo that loading it as a causal LM needs: top-level configs and tokenizer files, and
    the safetensors weights (the transformers-format ones, model*.safetensors, when there are others too,
    e.g. Mistral's consolidated.safetensors); *.bin weights only when the repo has no safetensors."""
    top = [f for f in files if "/" not in f]
    meta = [f for f in top if f.endswith(META_SUFFIXES)]
    weights = [f for f in top if f.endswith(".safetensors")]
    if any(f.startswith("model") for f in weights):
        weights = [f for f in weights if f.startswith("model")]
    if not weights:
        bins = [f for f in top if f.endswith(".bin") and f != "training_args.bin"]
        weights = [f for f in bins if f.startswith("pytorch_model")] or bins
    return sorted(meta + weights)


def _download(repo: str, revision: str, shown: str) -> Path:
    """Download what wanted_files picks into the Hugging Face cache; Hub errors become one line."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi().model_info(repo, revision=revision or None)
        files = [s.rfilename for s in info.siblings or []]
        wanted = wanted_files(files)
        if "config.json" not in wanted:
            ggufs = [f for f in files if f.endswith(".gguf")]
            hint = (f"it holds GGUF files ({', '.join(ggufs[:3])}): `hf download {repo} {ggufs[0]}` and give that "
                    "file's path") if ggufs else "give a transformers causal-LM repo"  # fmt: skip
            raise ModelError(f"{shown} has no config.json on the Hub; {hint}")
        print(
            f"lite-verl: downloading {repo} ({len(wanted)} files) into the Hugging Face cache",
            file=sys.stderr,
        )
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=wanted))
    except ModelError:
        raise
    except GatedRepoError:
        raise ModelError(
            f"{shown} is gated: accept its terms at https://huggingface.co/{repo}, then log in "
            "(`hf auth login`, or set HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise ModelError(
            f"{shown} does not exist: no such local directory, nor a model on the Hugging Face Hub "
            "(a private one needs `hf auth login` or HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ModelError(
            f"{shown}: revision {revision!r} does not exist; give a branch, tag or commit of {repo}"
        ) from None
    except Exception as e:  # the network boundary: no connection, a proxy, the Hub down, a full disk
        why = first_line(e)
        raise ModelError(
            f"{shown} is no local path, not in the Hugging Face cache, and downloading it failed ({type(e).__name__}: "
            f"{why}); check the path or the network, or fetch it with `{fetch_command(repo, revision)}`"
        ) from None
