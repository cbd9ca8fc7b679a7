"""Hugging Face Hub names (`namespace/name`) resolved to a local snapshot directory with huggingface_hub.

The local cache comes first: a complete snapshot of the revision there is used as is, without a
network call. Otherwise, unless offline (`HF_HUB_OFFLINE=1`), the snapshot is downloaded into the
cache, only the files rlt reads (ALLOW_PATTERNS: config, safetensors weights, tokenizer and chat
template files; never Python code or pickle weights). The cache directory is `download_dir` when
given, else `HF_HUB_CACHE`, else `HF_HOME/hub`, else huggingface_hub's default; these environment
variables are read at each call, so they may change after import.
"""

from __future__ import annotations

import json
import os
import re
from typing import Optional

from ..errors import CheckpointError

# What a snapshot download fetches: everything the loader and the tokenizer read, nothing else.
ALLOW_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
                  "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                  "chat_template.json", "generation_config.json"]
TOKENIZER_PATTERNS = [p for p in ALLOW_PATTERNS if "safetensors" not in p and p not in ("config.json", "generation_config.json")]
_TRUE = {"1", "ON", "YES", "TRUE"}
# namespace/name: what a Hub model id looks like (huggingface_hub validates it further).
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def looks_like_repo_id(name: str) -> bool:
    """Whether `name` has the shape of a Hub model id `namespace/name` (not `./x`, `/x`, `~/x`, `a/b/c`)."""
    return bool(_REPO_ID.match(name)) and ".." not in name


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value, now or when huggingface_hub was imported."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or any(
        os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cache_dir(download_dir: Optional[str] = None) -> str:
    """The Hub cache used: download_dir, else $HF_HUB_CACHE, else $HF_HOME/hub, else huggingface_hub's default."""
    if download_dir:
        return os.path.expanduser(download_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def resolve_repo(repo_id: str, *, revision: Optional[str] = None, download_dir: Optional[str] = None,
                 what: str = "model") -> str:
    """The local snapshot directory of Hub repo `repo_id` at `revision` (default: main).

    what: "model" (config, weights and tokenizer must be there) or "tokenizer" (tokenizer files
    only). Raises CheckpointError saying where it looked (the cache path, offline or not) and why.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = cache_dir(download_dir)
    patterns = ALLOW_PATTERNS if what == "model" else TOKENIZER_PATTERNS
    rev = revision or "main"
    where = f"{what} {repo_id!r} (revision {rev!r}): looked in the Hugging Face cache {cache}"
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True)
        missing = _missing_files(path, what)
    except LocalEntryNotFoundError:
        path, missing = None, ["the snapshot"]
    except HFValidationError as exc:
        raise CheckpointError(f"{what} {repo_id!r} is not a valid Hub repository id or revision ({exc})") from None
    if not missing:
        return path
    if offline():
        raise CheckpointError(f"{where}: {_describe(missing)} not there, and HF_HUB_OFFLINE is set, so nothing was "
                              "downloaded; download it while online (or unset HF_HUB_OFFLINE), or give a local "
                              "directory")
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache, allow_patterns=patterns)
    except Exception as exc:  # network, 401/404, gated repository, unknown revision, disk: all reported alike
        raise CheckpointError(f"{where}: {_describe(missing)} not there, and downloading it failed: "
                              f"{type(exc).__name__}: {exc}") from None
    missing = _missing_files(path, what)
    if missing:
        raise CheckpointError(f"{what} {repo_id!r} (revision {rev!r}), downloaded to {path}: {_describe(missing)} "
                              "missing from the repository (rlt reads safetensors weights only)")
    return path


def _describe(missing: list[str]) -> str:
    return missing[0] + (" is" if len(missing) == 1 else f" (and {len(missing) - 1} more) are")


def _missing_files(path: str, what: str) -> list[str]:
    """Files a complete snapshot of `what` needs that `path` lacks (a partial cache is completed online)."""
    if what == "tokenizer":
        return [] if os.path.isfile(os.path.join(path, "tokenizer.json")) else ["tokenizer.json"]
    missing = [] if os.path.isfile(os.path.join(path, "config.json")) else ["config.json"]
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return missing
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.isfile(index):
        return missing + ["model.safetensors (or model.safetensors.index.json)"]
    try:
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return missing  # a broken index is reported by the checkpoint loader, naming the file
    return missing + [s for s in shards if not isinstance(s, str) or not os.path.isfile(os.path.join(path, s))]
