"""A script of benchmarks/device/ (a folder of scripts, not a package) imported as a module,
for the tests of its pure parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DEVICE = Path(__file__).resolve().parents[3] / "benchmarks" / "device"


def load_device_script(name: str) -> ModuleType:
    """benchmarks/device/`name`.py, imported as module `device_<name>`."""
    spec = importlib.util.spec_from_file_location(f"device_{name}", DEVICE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
