from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from qwen3_checkpoints import SPECS, write_checkpoint


@pytest.fixture(scope="session")
def qwen3_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every tiny Qwen3 spec, written once per test session."""
    root = tmp_path_factory.mktemp("qwen3")
    return {name: write_checkpoint(spec, root / name) for name, spec in SPECS.items()}


@pytest.fixture(scope="session")
def qwen3_dir(qwen3_dirs: dict[str, Path]) -> Path:
    return qwen3_dirs["gqa-tied"]
