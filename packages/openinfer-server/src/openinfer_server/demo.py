"""The built-in demo model, found through the model registry: a model line offers one by
registering with `demo="module:function"` (the function returns the checkpoint folder)."""

from __future__ import annotations

from pathlib import Path

from openinfer_core.errors import PluginError
from openinfer_core.registry import Registries, import_target
from openinfer_server.model_source import ModelSourceError

DEMO_SERVED_NAME = "openinfer-demo"
DEMO_NOTICE = (
    "serving the built-in demo model: random weights, for trying the API, not for real answers"
)


def demo_checkpoint(registries: Registries) -> tuple[str, Path]:
    """(model line name, checkpoint folder) of the first model line that offers a demo; the
    folder is written on first use by the plugin and cached."""
    for entry in registries.models.entries():
        target = entry.meta.get("demo")
        if target:
            try:
                folder = Path(import_target(str(target))())
            except OSError as exc:
                raise ModelSourceError(
                    f"could not write the demo model ({exc}); set OPENINFER_CACHE_DIR to a "
                    "writable folder with some 50 MB free") from exc
            return entry.name, folder
    installed = ", ".join(registries.models.names()) or "none"
    raise PluginError(
        "no installed model line offers a demo model (installed model lines: "
        f"{installed}); install one with `pip install openinfer-qwen3`, or pass MODEL")
