"""The built-in demo model, found through the model registry: a model line offers one by
registering with `demo="module:function"` (the function returns the checkpoint folder), and
`demo_priority=N` (default 0) ranks it for `openinfer serve` with neither MODEL nor `--demo`."""

from __future__ import annotations

from pathlib import Path

from openinfer_core.errors import PluginError
from openinfer_core.registry import Registries, import_target
from openinfer_server.model_source import ModelSourceError

DEMO_SERVED_NAME = "openinfer-demo"
DEMO_NOTICE = (
    "serving the built-in demo model: random weights, for trying the API, not for real answers"
)


def demo_checkpoint(registries: Registries, line: str | None = None) -> tuple[str, Path]:
    """(model line name, checkpoint folder) of model line `line`'s demo, or with no `line` of
    the line whose demo ranks first (highest `demo_priority`, then name); the folder is
    written on first use by the plugin and cached."""
    offering = sorted((e for e in registries.models.entries() if e.meta.get("demo")),
                      key=lambda e: (-int(e.meta.get("demo_priority", 0)), e.name))
    installed = ", ".join(e.name for e in offering) or "none"
    if line is not None:
        offering = [e for e in offering if e.name == line]
        if not offering:
            raise PluginError(f"--demo {line}: no installed model line of that name offers a "
                              f"demo model (lines with one: {installed})")
    if not offering:
        raise PluginError(
            "no installed model line offers a demo model (installed model lines: "
            f"{', '.join(registries.models.names()) or 'none'}); install one with "
            "`pip install openinfer-qwen3`, or pass MODEL")
    entry = offering[0]
    try:
        folder = Path(import_target(str(entry.meta["demo"]))())
    except OSError as exc:
        raise ModelSourceError(
            f"could not write the demo model ({exc}); set OPENINFER_CACHE_DIR to a "
            "writable folder with some 100 MB free") from exc
    return entry.name, folder
