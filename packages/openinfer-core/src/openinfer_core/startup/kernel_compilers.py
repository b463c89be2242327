"""The kernel compilers the plugins registered (`openinfer_register_kernel_compilers`), and
what their on-disk caches hold for this install, known before torch is imported.

A start that compiles ahead and finishes leaves a mark for the compiled kernels' sources and the
compilers' versions in each compiler's cache (besides compile_plan.py's per-setup stamp). The
engine process checks for it first thing: where there is none and a GPU is present, this start
will compile, so it starts the compilers' worker processes before importing torch, and their
imports overlap the engine's. Kept free of torch imports."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from openinfer_core.interfaces.kernel_compiler import KernelCompiler
from openinfer_core.plugins import PluginManager

log = logging.getLogger("openinfer")

MARKS = "openinfer-kernels-compiled"  # the marks' folder inside each compiler's cache
MODE_ENV = "OPENINFER_COMPILE_AHEAD"  # compile_plan's: 0 starts no workers either


def sources_digest(sources: Iterable[str]) -> str:
    """A digest of the names, sizes and modification times of the .py files of `sources`
    (packages, or modules): it changes when a kernel's source does ('' when none of them is
    installed). Finding a package's files imports its parent packages, never the package."""
    digest = hashlib.sha256()
    found = False
    for name in sorted(set(sources)):
        for path in _source_files(name):
            found = True
            stat = path.stat()
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest() if found else ""


def _source_files(name: str) -> list[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [p for root in spec.submodule_search_locations
                for p in sorted(Path(root).rglob("*.py"))]
    return [Path(spec.origin)] if spec.origin and spec.origin.endswith(".py") else []


@dataclass(frozen=True, slots=True)
class KernelCompilers:
    """Every registered compiler (one per target) and the packages whose kernels they
    compile. Empty where no plugin registered one: then nothing compiles ahead."""

    compilers: tuple[KernelCompiler, ...] = ()
    sources: tuple[str, ...] = ()

    @classmethod
    def from_plugins(cls, plugins: PluginManager) -> KernelCompilers:
        entries = list(plugins.registries.kernel_compilers.entries())
        built: dict[str, KernelCompiler] = {}
        for entry in entries:
            if entry.target not in built:
                built[entry.target] = entry.load()()
        sources = sorted({s for e in entries for s in e.meta.get("sources", ())})
        return cls(tuple(built.values()), tuple(sources))

    def __bool__(self) -> bool:
        return bool(self.compilers)

    def fingerprint(self) -> str:
        """What the compiled kernels depend on besides a start's setup: the sources, the
        compilers' versions."""
        versions = ",".join(c.version() for c in self.compilers)
        return f"{sources_digest(self.sources)}:{versions}"

    def marks(self, folder: str, name: str) -> list[Path]:
        """The mark `name` in `folder`, in each compiler's cache."""
        return [c.cache_dir() / folder / name for c in self.compilers]

    def _install_marks(self) -> list[Path]:
        name = hashlib.sha256(self.fingerprint().encode()).hexdigest()[:32]
        return self.marks(MARKS, name)

    def compiled(self) -> bool:
        """Whether a start of this install's kernels compiled ahead and finished."""
        return bool(self.compilers) and all(p.exists() for p in self._install_marks())

    def mark_compiled(self) -> None:
        for path in self._install_marks():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()

    def start_workers(self) -> None:
        for compiler in self.compilers:
            compiler.start_workers()

    def stop_workers(self) -> None:
        for compiler in self.compilers:
            compiler.stop_workers()

    @contextmanager
    def compiling(self) -> Iterator[None]:
        """Within: every compiler's launches compile and launch nothing."""
        with ExitStack() as stack:
            for compiler in self.compilers:
                stack.enter_context(compiler.compiling())
            yield


def start_compile_workers(device: str, plugins: PluginManager) -> bool:
    """Start the compile workers where this start will likely compile kernels: compile-ahead
    not off, a CUDA device asked for (or "auto" with an NVIDIA driver present), a compiler
    registered, and no mark for its sources yet. Whether it started them."""
    if os.environ.get(MODE_ENV, "auto") == "0":
        return False
    if not (device.startswith("cuda") or (device == "auto" and Path("/dev/nvidiactl").exists())):
        return False
    compilers = KernelCompilers.from_plugins(plugins)
    if not compilers or compilers.compiled():
        return False
    compilers.start_workers()
    return True
