"""`--load-format dummy`: a checkpoint's real shapes with random weights, for benchmarks and
smoke tests without downloading weights.

The model line that matches the checkpoint writes the tensors (its registry entry names a
writer as `dummy_weights="module:function"`, called with the config folder and the
destination); this module copies the config and tokenizer files beside them and caches the
result under the openinfer cache, keyed by those files' contents."""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

from openinfer_core.errors import ModelConfigError
from openinfer_core.model_config import read_model_config
from openinfer_core.registry import Registries, import_target
from openinfer_server.model_source import CONFIG_FILES, ModelSourceError, cache_root

log = logging.getLogger("openinfer.server")


def dummy_checkpoint(model_dir: Path, registries: Registries) -> Path:
    """A cached folder with `model_dir`'s config and tokenizer and random weights."""
    config = read_model_config(model_dir)
    entry = registries.models.match(config)
    writer = entry.meta.get("dummy_weights")
    if not writer:
        raise ModelConfigError(
            f"--load-format dummy: model line {entry.name!r} (plugin {entry.plugin}) cannot "
            "write random weights; use --load-format safetensors with a real checkpoint")
    side_files = [name for name in CONFIG_FILES if (model_dir / name).is_file()]
    digest = hashlib.sha256(str(writer).encode())
    for name in side_files:
        digest.update(name.encode() + b"\0" + (model_dir / name).read_bytes())
    final = cache_root() / "dummy" / f"{entry.name}-{digest.hexdigest()[:16]}"
    if not final.is_dir():
        log.info("--load-format dummy: writing random weights to %s (first use)", final)
        try:
            _write(final, model_dir, side_files, str(writer))
        except OSError as exc:
            raise ModelSourceError(
                f"--load-format dummy: could not write random weights to {final} ({exc}); set "
                "OPENINFER_CACHE_DIR to a writable folder with room for the model") from exc
    return final


def _write(final: Path, model_dir: Path, side_files: list[str], writer: str) -> None:
    """Into a temp folder beside `final`, renamed when complete: readers never see half."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        import_target(writer)(model_dir, tmp)
        for name in side_files:
            shutil.copyfile(model_dir / name, tmp / name)
        tmp.chmod(0o755)
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():  # not a concurrent writer finishing first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
