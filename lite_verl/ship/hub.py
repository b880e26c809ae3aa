"""Push an exported model directory to the Hugging Face Hub (huggingface_hub does the upload).

`--dry-run` prints the upload plan (repo, visibility, every file and its size) and touches no network; a real
push creates the repo if needed and uploads the folder in one commit. Hub and network failures are one line.
"""

from __future__ import annotations

import re
from pathlib import Path

from lite_verl.errors import UserError, first_line

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def check_repo_id(repo: str) -> str:
    if not REPO_ID.match(repo) or ".." in repo or repo.endswith((".git", ".")):
        raise UserError(f"--push-to-hub {repo!r}: give a Hub repo id as org/name (letters, digits, - _ .)")
    return repo


def check_token(repo: str) -> None:
    """Before a long export: a push without a token would fail at the end."""
    from huggingface_hub import get_token

    if not get_token():
        raise UserError(
            f"--push-to-hub {repo}: no Hugging Face token; log in with `hf auth login` (write access) or set "
            "HF_TOKEN, or add --dry-run to see what would be pushed"
        )


def upload_plan(folder: Path, repo: str, private: bool) -> list[str]:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    lines = [f"push {folder} -> https://huggingface.co/{repo} ({'private' if private else 'public'}), "
             f"{len(files)} files, {total / 2**20:.1f} MiB:"]  # fmt: skip
    lines += [f"  {p.relative_to(folder)}  {p.stat().st_size / 2**20:.2f} MiB" for p in files]
    return lines


def push(folder: Path, repo: str, private: bool, message: str) -> str:
    """Create `repo` (kept if it exists) and upload `folder` in one commit; -> the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        if private and not api.repo_info(repo).private:  # create_repo keeps an existing repo as it is
            raise UserError(f"--push-to-hub {repo} --private: the repo exists and is public; nothing was pushed "
                            "(make it private on the Hub first, or push to another repo)")  # fmt: skip
        info = api.upload_folder(folder_path=str(folder), repo_id=repo, commit_message=message)
    except UserError:
        raise
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise UserError(
                f"--push-to-hub {repo}: the Hub refused the token ({status}); log in with `hf auth login` "
                "(a token with write access) or set HF_TOKEN"
            ) from None
        raise UserError(f"--push-to-hub {repo}: the Hub answered an error ({first_line(e)})") from None
    except Exception as e:  # the network boundary: offline, a proxy, DNS, a timeout
        raise UserError(
            f"--push-to-hub {repo}: could not reach the Hugging Face Hub ({type(e).__name__}: {first_line(e)}); the export "
            f"is kept in {folder}: push it later with `hf upload {repo} {folder}`"
        ) from None
    return str(getattr(info, "commit_url", info))
