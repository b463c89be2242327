"""The plugin manager: entry points of group `openinfer`, loaded once per process."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

import pluggy

from openinfer_core import hookspecs
from openinfer_core.errors import PluginError
from openinfer_core.registry import Registries, bind

ENTRY_POINT_GROUP = "openinfer"
ALLOWLIST_ENV = "OPENINFER_PLUGINS"

_lock = threading.Lock()
_default: PluginManager | None = None


def allowlist_from_env() -> frozenset[str] | None:
    """`OPENINFER_PLUGINS=core,qwen3` loads only those entry points; unset loads all."""
    raw = os.environ.get(ALLOWLIST_ENV)
    if raw is None or raw.strip() in ("", "*"):
        return None
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


class PluginManager:
    """A pluggy manager with openinfer's hookspecs and the registries its plugins fill.

    `autoload=True` loads every entry point of group `openinfer` (filtered by `allowlist`);
    tests build one with `autoload=False` and `register()` the plugins they want."""

    def __init__(self, *, autoload: bool = True, allowlist: Iterable[str] | None = None,
                 plugins: Iterable[Any] = ()) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._registries: Registries | None = None
        self.allowlist = frozenset(allowlist) if allowlist is not None else None
        if autoload:
            self._load_entry_points()
        for plugin in plugins:
            self.register(plugin)

    def _load_entry_points(self) -> None:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if self.allowlist is not None and ep.name not in self.allowlist:
                continue
            if self.pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}. "
                    f"Fix or uninstall it, or leave it out of {ALLOWLIST_ENV}."
                ) from exc
            self.pm.register(plugin, name=ep.name)

    def register(self, plugin: Any, name: str | None = None) -> None:
        self.pm.register(plugin, name=name)
        self._registries = None

    def plugin_names(self) -> list[str]:
        return sorted(n for n, _ in self.pm.list_name_plugin())

    @property
    def registries(self) -> Registries:
        """The registries, built on first use by calling every plugin's hooks."""
        if self._registries is None:
            self._registries = self._collect()
        return self._registries

    def _collect(self) -> Registries:
        regs = Registries()
        hooks = (
            ("openinfer_register_models", regs.models),
            ("openinfer_register_schedulers", regs.schedulers),
            ("openinfer_register_offload_tiers", regs.offload_tiers),
            ("openinfer_register_attention_backends", regs.attention_backends),
            ("openinfer_register_tool_parsers", regs.tool_parsers),
            ("openinfer_register_reasoning_parsers", regs.reasoning_parsers),
            ("openinfer_register_kernel_compilers", regs.kernel_compilers),
        )
        for hook_name, registry in hooks:
            # Each implementation is called on its own so its entries carry its plugin's name.
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                impl.function(register=bind(registry, impl.plugin_name))
        return regs


def get_plugin_manager() -> PluginManager:
    """The process-wide manager: entry points loaded once, honouring `OPENINFER_PLUGINS`."""
    global _default
    with _lock:
        if _default is None:
            _default = PluginManager(autoload=True, allowlist=allowlist_from_env())
        return _default


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (tests that change the environment)."""
    global _default
    with _lock:
        _default = None
