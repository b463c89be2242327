"""A test plugin using every hook but the model one (the toy plugin's): a scheduler, an offload
tier, an attention backend, a tool-call parser, a reasoning parser and a kernel compiler."""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from openinfer_core.engine.request_state import RequestState
from openinfer_core.engine.scheduler import FcfsScheduler
from openinfer_core.hookspecs import hookimpl
from openinfer_core.interfaces.offload import OffloadContext, TierStats
from openinfer_core.interfaces.parsers import ReasoningParse, ToolCallDelta, ToolParse
from openinfer_kernels.attention.backend import TorchAttentionBackend


class LifoScheduler(FcfsScheduler):
    """Newest waiting request first."""

    def _enqueue(self, seq: RequestState) -> None:
        self.waiting.appendleft(seq)


class CountingAttention(TorchAttentionBackend):
    name = "counting"
    calls: ClassVar[int] = 0

    # Every step passes here: `attend` appends, then calls it; model lines that append in
    # their own kernels call it directly.
    def attend_appended(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        type(self).calls += 1
        return super().attend_appended(*args, **kwargs)


class MemoryStore:
    """A `BlockStore` beneath the host tier: blocks kept in a dict, keyed by hash. Reads wait
    for `gate` (open unless a test closes it), so a test can hold restores in flight."""

    name = "memory"
    gate: ClassVar[threading.Event] = threading.Event()
    instances: ClassVar[list[MemoryStore]] = []

    def __init__(self, context: OffloadContext) -> None:
        self.blocks: dict[int, bytes] = {}
        self.reads = 0
        type(self).instances.append(self)

    def contains(self, key: int) -> bool:
        return key in self.blocks

    def put(self, key: int, data: memoryview) -> None:
        self.blocks[key] = bytes(data)

    def get(self, key: int, out: memoryview) -> bool:
        self.gate.wait(30)
        self.reads += 1
        out[:] = self.blocks[key]
        return True

    def stats(self) -> TierStats:
        return TierStats(self.name, saved=len(self.blocks), used_blocks=len(self.blocks))

    def close(self) -> None:
        pass


MemoryStore.gate.set()


class EchoToolParser:
    """The whole output is one call to `echo`, its text as the `text` argument."""

    def __init__(self, *, tools: Sequence[Mapping[str, Any]]) -> None:
        self._parts: list[str] = []

    def feed(self, text: str) -> ToolParse:
        self._parts.append(text)
        return ToolParse()

    def finish(self) -> ToolParse:
        arguments = json.dumps({"text": "".join(self._parts)})
        return ToolParse(calls=(ToolCallDelta(0, "call_echo", "echo", arguments),))


class AllReasoningParser:
    """The whole output is reasoning."""

    def __init__(self, *, prompt: str | None) -> None:
        pass

    def feed(self, text: str) -> ReasoningParse:
        return ReasoningParse(reasoning=text)

    def finish(self) -> ReasoningParse:
        return ReasoningParse()


class RecordingCompiler:
    """A `KernelCompiler` that compiles nothing and records what start-up asks of it."""

    folder: ClassVar[Path] = Path(tempfile.gettempdir()) / "openinfer-sample-compiler"
    calls: ClassVar[list[str]] = []

    def cache_dir(self) -> Path:
        return self.folder

    def version(self) -> str:
        return "1.0"

    def start_workers(self) -> None:
        self.calls.append("start_workers")

    def stop_workers(self) -> None:
        self.calls.append("stop_workers")

    @contextlib.contextmanager
    def compiling(self) -> Iterator[None]:
        self.calls.append("compiling")
        yield
        self.calls.append("compiled")


@hookimpl
def openinfer_register_schedulers(register: Any) -> None:
    register("lifo", "sample_plugin:LifoScheduler")


@hookimpl
def openinfer_register_offload_tiers(register: Any) -> None:
    register("memory", "sample_plugin:MemoryStore", first=False)


@hookimpl
def openinfer_register_attention_backends(register: Any) -> None:
    register("counting", "sample_plugin:CountingAttention", devices=("cpu",), priority=10)


@hookimpl
def openinfer_register_tool_parsers(register: Any) -> None:
    register("echo", "sample_plugin:EchoToolParser")


@hookimpl
def openinfer_register_reasoning_parsers(register: Any) -> None:
    register("all-reasoning", "sample_plugin:AllReasoningParser")


@hookimpl
def openinfer_register_kernel_compilers(register: Any) -> None:
    register("recording", "sample_plugin:RecordingCompiler", sources=("sample_plugin",))
    # Another package's kernels, compiled by the same compiler: one instance, both sources.
    register("recording-toy", "sample_plugin:RecordingCompiler", sources=("openinfer_toy",))
