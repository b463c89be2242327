"""openinfer's own cache folder: demo checkpoints, tokenizer files, the start-up cache."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "OPENINFER_CACHE_DIR"


def cache_root() -> Path:
    """$OPENINFER_CACHE_DIR, default ~/.cache/openinfer (not created here)."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "openinfer"
