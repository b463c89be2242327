"""Name -> lazily imported class, filled by the plugin hooks."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from openinfer_core.errors import PluginError, UnsupportedModelError

T = TypeVar("T")


def import_target(target: str) -> Any:
    """Import `"package.module:Attr"` and return the attribute."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"registry target {target!r} must look like 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"cannot import {module_name!r} for {target!r}: {exc}") from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        raise PluginError(f"{module_name!r} has no attribute {attr!r} (from {target!r})") from exc
    return obj


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    target: str
    plugin: str  # the plugin that registered it, for error messages and `openinfer models`
    meta: Mapping[str, Any] = field(default_factory=dict)

    def load(self) -> Any:
        return import_target(self.target)


class Registry(Generic[T]):
    """Entries by name. Registration never imports the target; `resolve` does."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def add(self, name: str, target: str, *, plugin: str = "?", **meta: Any) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"{self.kind} name must be a non-empty string, got {name!r}")
        old = self._entries.get(name)
        if old is not None and old.target != target:
            raise PluginError(
                f"{self.kind} {name!r} registered twice: {old.target} (plugin {old.plugin}) "
                f"and {target} (plugin {plugin})"
            )
        self._entries[name] = Entry(name, target, plugin, dict(meta))

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> Iterator[Entry]:
        yield from (self._entries[n] for n in self.names())

    def get(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(self.names()) or "none installed"
            raise PluginError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def resolve(self, name: str) -> T:
        entry = self.get(name)
        return entry.load()

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


class RegisterModel(Protocol):
    def __call__(self, name: str, target: str, *, architectures: tuple[str, ...] = (),
                 model_types: tuple[str, ...] = (), probe: str | None = None,
                 tool_parser: str | None = None, reasoning_parser: str | None = None,
                 **meta: Any) -> None: ...


class RegisterScheduler(Protocol):
    def __call__(self, name: str, target: str) -> None: ...


class RegisterOffloadTier(Protocol):
    def __call__(self, name: str, target: str) -> None: ...


class RegisterParser(Protocol):
    def __call__(self, name: str, target: str) -> None: ...


class RegisterAttentionBackend(Protocol):
    def __call__(self, name: str, target: str, *, devices: tuple[str, ...] = ("cpu", "cuda"),
                 priority: int = 0) -> None: ...


class RegisterKernelCompiler(Protocol):
    def __call__(self, name: str, target: str, *, sources: tuple[str, ...] = ()) -> None: ...


class ModelRegistry(Registry[Any]):
    """Model lines, matched to a checkpoint by its config.json."""

    def __init__(self) -> None:
        super().__init__("model line")

    def match(self, config: Mapping[str, Any]) -> Entry:
        """The model line for a parsed config.json: by `architectures`, then `model_type`,
        then each line's probe. Raises `UnsupportedModelError` listing what is installed."""
        archs = config.get("architectures") or []
        if isinstance(archs, str):
            archs = [archs]
        for arch in archs:
            for entry in self.entries():
                if arch in entry.meta.get("architectures", ()):
                    return entry
        model_type = config.get("model_type")
        for entry in self.entries():
            if model_type and model_type in entry.meta.get("model_types", ()):
                return entry
        for entry in self.entries():
            probe = entry.meta.get("probe")
            if probe and import_target(probe)(config):
                return entry
        installed = "; ".join(
            f"{e.name} ({', '.join(e.meta.get('architectures', ())) or 'probe'})"
            for e in self.entries()
        ) or "none"
        raise UnsupportedModelError(
            f"no installed model line supports architectures={list(archs)} "
            f"model_type={model_type!r}. Installed model lines: {installed}. "
            "Install the package for this model (e.g. `pip install openinfer-qwen3`) or check "
            "OPENINFER_PLUGINS."
        )


@dataclass
class Registries:
    """Everything the plugins registered in one process."""

    models: ModelRegistry = field(default_factory=ModelRegistry)
    schedulers: Registry[Any] = field(default_factory=lambda: Registry("scheduler"))
    offload_tiers: Registry[Any] = field(default_factory=lambda: Registry("offload tier"))
    attention_backends: Registry[Any] = field(
        default_factory=lambda: Registry("attention backend")
    )
    tool_parsers: Registry[Any] = field(default_factory=lambda: Registry("tool-call parser"))
    reasoning_parsers: Registry[Any] = field(
        default_factory=lambda: Registry("reasoning parser")
    )
    kernel_compilers: Registry[Any] = field(default_factory=lambda: Registry("kernel compiler"))

    def default_attention_backend(self, device: str) -> str:
        """The registered backend of highest priority that runs on `device` ("cpu"/"cuda")."""
        usable = [e for e in self.attention_backends.entries()
                  if device in e.meta.get("devices", ())]
        if not usable:
            raise PluginError(
                f"no attention backend runs on {device!r}; installed: "
                f"{', '.join(self.attention_backends.names()) or 'none'}"
            )
        return max(usable, key=lambda e: (e.meta.get("priority", 0), e.name)).name


def bind(registry: Registry[Any], plugin: str) -> Callable[..., None]:
    """A `register` callable for one plugin's hook call."""

    def register(name: str, target: str, **meta: Any) -> None:
        registry.add(name, target, plugin=plugin, **meta)

    return register
