"""Compiling kernels ahead of their first launch: the compiler a kernel package registers
(`openinfer_register_kernel_compilers`).

Start-up (`openinfer_core.startup`) runs every forward it will run once more, first, inside
`KernelCompiler.compiling()`: each kernel launch compiles its variant, in parallel, and launches
nothing; the real forwards that follow find every variant compiled. Only for a model that
declares `capabilities.SupportsCompileAhead`."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class KernelCompiler(Protocol):
    """A kernel package's compile-ahead machinery (openinfer-kernels': Triton's), built with
    no arguments. The engine process calls `cache_dir`, `version` and `start_workers` before it
    imports torch, so importing the module that defines it and those three calls must not
    import torch. Process-wide: every instance shares one set of workers."""

    def cache_dir(self) -> Path:
        """The folder compiled kernels are kept in on disk. Start-up keeps its "already
        compiled" marks inside, so emptying it drops them too. Pure."""
        ...

    def version(self) -> str:
        """The compiler's version ('' when unknown): compiled kernels of another version are
        not reused. Pure."""
        ...

    def start_workers(self) -> None:
        """Start compile worker processes now, so that their imports overlap the engine's.
        Returns at once; idempotent."""
        ...

    def stop_workers(self) -> None:
        """End the workers, if any were started (start-up is over). Idempotent."""
        ...

    def compiling(self) -> AbstractContextManager[None]:
        """Within: a kernel launch compiles its variant (in the workers when started) and
        launches nothing, so outputs keep whatever they held; leaving waits for every
        compilation, keeping them where the real launches find them."""
        ...
