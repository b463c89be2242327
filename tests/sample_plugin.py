"""A test plugin using every hook but the model one (the toy plugin's): a scheduler, an offload
tier, an attention backend, a tool-call parser and a reasoning parser."""

from __future__ import annotations

import json
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any, ClassVar

import torch

from openinfer_core.engine.scheduler import FcfsScheduler
from openinfer_core.engine.sequence import Sequence
from openinfer_core.hookspecs import hookimpl
from openinfer_core.interfaces.parsers import ReasoningParse, ToolCallDelta, ToolParse
from openinfer_kernels.attention.backend import TorchAttentionBackend


class LifoScheduler(FcfsScheduler):
    """Newest waiting request first."""

    def _enqueue(self, seq: Sequence) -> None:
        self.waiting.appendleft(seq)


class CountingAttention(TorchAttentionBackend):
    name = "counting"
    calls: ClassVar[int] = 0

    def attend(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        type(self).calls += 1
        return super().attend(*args, **kwargs)


class _Done:
    def poll(self) -> bool:
        return True


class MemoryTier:
    """Blocks copied into a dict, keyed by hash."""

    name = "memory"

    def __init__(self) -> None:
        self.store: dict[int, torch.Tensor] = {}

    def save(self, hashes: Seq[int], blocks: Seq[torch.Tensor]) -> None:
        for h, b in zip(hashes, blocks, strict=True):
            self.store[h] = b.detach().clone()

    def query(self, hashes: Seq[int]) -> int:
        n = 0
        while n < len(hashes) and hashes[n] in self.store:
            n += 1
        return n

    def load(self, hashes: Seq[int], into: Seq[torch.Tensor]) -> _Done:
        for h, dst in zip(hashes, into, strict=True):
            dst.copy_(self.store[h])
        return _Done()


class EchoToolParser:
    """The whole output is one call to `echo`, its text as the `text` argument."""

    def __init__(self, *, tools: Seq[Mapping[str, Any]]) -> None:
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


@hookimpl
def openinfer_register_schedulers(register: Any) -> None:
    register("lifo", "sample_plugin:LifoScheduler")


@hookimpl
def openinfer_register_offload_tiers(register: Any) -> None:
    register("memory", "sample_plugin:MemoryTier")


@hookimpl
def openinfer_register_attention_backends(register: Any) -> None:
    register("counting", "sample_plugin:CountingAttention", devices=("cpu",), priority=10)


@hookimpl
def openinfer_register_tool_parsers(register: Any) -> None:
    register("echo", "sample_plugin:EchoToolParser")


@hookimpl
def openinfer_register_reasoning_parsers(register: Any) -> None:
    register("all-reasoning", "sample_plugin:AllReasoningParser")
