"""What an engine serves: `generate` (tokens) or `embed` (pooling requests), chosen with
`EngineConfig.task` or, for `auto`, read from the checkpoint's sentence-transformers files.

A sentence-transformers checkpoint (Qwen3-Embedding's) lists its modules in `modules.json`;
one of type `sentence_transformers.models.Pooling` makes it an embedding model. Its pooling
config (`1_Pooling/config.json`) must ask for last-token pooling, the only kind the engine
computes (the hidden state of the last prompt token); the frontend L2-normalizes it, as
Qwen3-Embedding's Normalize module and vLLM's embedding default do."""

from __future__ import annotations

import json
from pathlib import Path

from openinfer_core.errors import ModelConfigError

TASKS = ("auto", "generate", "embed")
POOLING_MODULE = "sentence_transformers.models.Pooling"


def detect_task(model_dir: str | Path) -> str:
    """"embed" where `model_dir` holds a sentence-transformers Pooling module (last-token
    pooling; another mode raises `ModelConfigError`), else "generate"."""
    modules = _modules(Path(model_dir))
    pooling = next((m for m in modules if m.get("type") == POOLING_MODULE), None)
    if pooling is None:
        return "generate"
    config = Path(model_dir) / str(pooling.get("path", "")) / "config.json"
    if config.is_file():
        modes = {k: v for k, v in json.loads(config.read_text()).items()
                 if k.startswith("pooling_mode_") and v is True}
        if modes and "pooling_mode_lasttoken" not in modes:
            raise ModelConfigError(
                f"{config}: pooling {', '.join(sorted(modes))} is not supported; openinfer "
                "pools the last token only (pooling_mode_lasttoken, as Qwen3-Embedding)")
    return "embed"


def resolve_task(task: str, model_dir: str | Path) -> str:
    """`task` itself, or for "auto" what the checkpoint says."""
    if task not in TASKS:
        raise ModelConfigError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return detect_task(model_dir) if task == "auto" else task


def _modules(model_dir: Path) -> list[dict[str, object]]:
    path = model_dir / "modules.json"
    if not path.is_file():
        return []
    modules = json.loads(path.read_text())
    return [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
