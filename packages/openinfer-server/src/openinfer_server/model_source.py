"""From the MODEL argument to a local checkpoint folder: a folder as given, or a hub download."""

from __future__ import annotations

import logging
from pathlib import Path

from openinfer_core.errors import OpenInferError

log = logging.getLogger("openinfer.server")

# What a checkpoint folder needs to be served; everything else in a hub repo is skipped.
CONFIG_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
]
WEIGHT_FILES = ["*.safetensors", "model.safetensors.index.json"]


class ModelSourceError(OpenInferError):
    """MODEL is neither a usable local folder nor a downloadable hub repository."""


def resolve_model(model: str, *, with_weights: bool = True, revision: str | None = None,
                  download_dir: str | None = None) -> Path:
    """The local folder for `model`: itself when it exists on disk, else a snapshot of the hub
    repository of that id. `with_weights=False` downloads only config and tokenizer files."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelSourceError(
                f"MODEL {model!r} is a file; pass the checkpoint folder that holds config.json, "
                "*.safetensors and the tokenizer files")
        return path
    if not _looks_like_repo_id(model):
        raise ModelSourceError(
            f"model folder {model!r} does not exist; pass a local HuggingFace checkpoint folder "
            "or a hub id such as Qwen/Qwen3-0.6B")
    return download(model, with_weights=with_weights, revision=revision,
                    download_dir=download_dir)


def download(repo_id: str, *, with_weights: bool, revision: str | None,
             download_dir: str | None) -> Path:
    """snapshot_download of the files a checkpoint needs, with one-line errors."""
    # Imported here: `openinfer --help` and local folders never pay for huggingface_hub.
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    patterns = CONFIG_FILES + (WEIGHT_FILES if with_weights else [])
    where = f"{repo_id!r} is not a local folder, so it was looked up on the Hugging Face Hub"
    log.info("downloading %s from the Hugging Face Hub (%s)", repo_id,
             "config, tokenizer and weights" if with_weights else "config and tokenizer only")
    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=download_dir,
                                   allow_patterns=patterns)
    except GatedRepoError:
        raise ModelSourceError(
            f"{where}, but it is gated: accept its terms on huggingface.co and log in with "
            "`hf auth login` (or set HF_TOKEN), then try again") from None
    except RepositoryNotFoundError:
        raise ModelSourceError(
            f"{where}, but no such repository exists (or it is private): check the spelling, "
            "or log in with `hf auth login` / set HF_TOKEN for a private one") from None
    except RevisionNotFoundError:
        raise ModelSourceError(
            f"{where}, but it has no revision {revision!r}; check --revision") from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        raise ModelSourceError(
            f"{where}, but the hub cannot be reached and no copy is cached: check the network "
            "(or HF_ENDPOINT / HF_HUB_OFFLINE), or download the checkpoint elsewhere and pass "
            "its local folder") from None
    except HfHubHTTPError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelSourceError(
            f"{where}, but the download failed ({reason}); try again, or pass a local "
            "folder") from None
    except OSError as exc:
        raise ModelSourceError(
            f"{where}, but the download failed ({exc}); check the network and the free disk "
            "space of the hub cache (HF_HOME or --download-dir), or pass a local folder") from None
    return Path(folder)


def _looks_like_repo_id(model: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True
