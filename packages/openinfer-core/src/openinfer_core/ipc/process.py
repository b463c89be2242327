"""Starting and stopping the engine-core process."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import shutil
import tempfile
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path

from openinfer_core.engine.config import EngineConfig
from openinfer_core.errors import OpenInferError
from openinfer_core.handle import ModelInfo
from openinfer_core.ipc.engine_core import EngineAddresses, run_engine_core


class EngineStartError(OpenInferError):
    """The engine process could not start (the message says why)."""


class EngineProcess:
    """A started engine-core process and how to reach it. `stop()` always, or the interpreter
    waits for it at exit."""

    def __init__(self, process: BaseProcess, control: multiprocessing.connection.Connection,
                 addresses: EngineAddresses, model_info: ModelInfo, folder: Path) -> None:
        self.process = process
        self.addresses = addresses
        self.model_info = model_info
        self._control = control
        self._folder = folder

    @classmethod
    def start(cls, config: EngineConfig, log_level: str = "info",
              while_starting: Callable[[], object] | None = None) -> EngineProcess:
        """Spawn the engine and wait until it is ready (weights loaded, KV allocated);
        `while_starting` runs here in the meantime."""
        [engine] = cls.start_many([config], log_level, while_starting)
        return engine

    @classmethod
    def start_many(cls, configs: Sequence[EngineConfig], log_level: str = "info",
                   while_starting: Callable[[], object] | None = None) -> list[EngineProcess]:
        """Spawn one engine per config (data-parallel replicas), all loading at once, and wait
        until every one is ready; if one fails, none is left running."""
        context = multiprocessing.get_context("spawn")
        started: list[tuple[BaseProcess, multiprocessing.connection.Connection,
                            EngineAddresses, Path]] = []
        try:
            for i, config in enumerate(configs):
                folder = Path(tempfile.mkdtemp(prefix="openinfer-"))
                addresses = EngineAddresses(f"ipc://{folder}/inputs", f"ipc://{folder}/outputs")
                control, child_end = context.Pipe()
                label = "engine" if len(configs) == 1 else f"engine {i}"
                process = context.Process(
                    target=run_engine_core, name=f"openinfer-{label.replace(' ', '-')}",
                    args=(config, addresses, child_end, log_level, label))
                started.append((process, control, addresses, folder))
                process.start()
                child_end.close()
            if while_starting is not None:
                while_starting()
            infos = [_wait_ready(p, c, None if len(started) == 1 else i)
                     for i, (p, c, _, _) in enumerate(started)]
        except BaseException:  # Ctrl-C while loading too: nothing may outlive us
            for p, _, _, f in started:
                _kill(p)
                shutil.rmtree(f, ignore_errors=True)
            raise
        return [cls(process, control, addresses, info, folder)
                for (process, control, addresses, folder), info in zip(started, infos,
                                                                       strict=True)]

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    def stop(self, timeout: float = 10.0) -> int | None:
        """Ask the engine to stop, kill it after `timeout`; returns its exit code."""
        with contextlib.suppress(OSError):  # it is gone already
            self._control.send("stop")
        self.process.join(timeout)
        if self.process.is_alive():
            _kill(self.process)
        self._control.close()
        shutil.rmtree(self._folder, ignore_errors=True)
        return self.process.exitcode


def set_process_name(name: str) -> None:
    """What `ps -o comm` and `top` show for this process (Linux; 15 characters)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        pr_set_name = 15
        libc.prctl(pr_set_name, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _wait_ready(process: BaseProcess, control: multiprocessing.connection.Connection,
                replica: int | None) -> ModelInfo:
    which = "the engine process" if replica is None else f"data-parallel replica {replica}"
    while not control.poll(0.2):
        if not process.is_alive():
            raise EngineStartError(f"{which} exited with code {process.exitcode} "
                                   "while starting (its log is above)")
    try:
        message = control.recv()
    except EOFError:
        process.join(5)
        raise EngineStartError(f"{which} exited with code {process.exitcode} "
                               "while starting (its log is above)") from None
    if message[0] != "ready":
        process.join(5)
        raise EngineStartError(message[1] if replica is None else f"{which}: {message[1]}")
    info: ModelInfo = message[1]
    return info


def _kill(process: BaseProcess) -> None:
    if process.pid is None:  # never started
        return
    if process.is_alive():
        process.kill()
    process.join(5)
