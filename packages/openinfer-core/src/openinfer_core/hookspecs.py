"""The whole plugin contract of openinfer: seven registration hooks, project name `openinfer`.

A plugin is a module (or object) exposed under the `openinfer` entry-point group whose functions
carry `@hookimpl`. Each hook receives a `register` callable and calls it once per thing it adds.
Registration is by `"module:Class"` string, so discovering plugins imports neither torch nor CUDA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from openinfer_core.registry import (
        RegisterAttentionBackend,
        RegisterKernelCompiler,
        RegisterModel,
        RegisterOffloadTier,
        RegisterParser,
        RegisterScheduler,
    )

PROJECT = "openinfer"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def openinfer_register_models(register: RegisterModel) -> None:
    """Add model lines: `register(name, target, architectures=(...), model_types=(...),
    probe=None)`. `target` is `"module:Class"` of a class implementing
    `openinfer_core.interfaces.model.ModelLine`. A checkpoint is matched by its config.json
    `architectures`, then `model_type`, then `probe` (a `"module:function"` taking the parsed
    config dict and returning bool). Optional extras a frontend may use: `demo="mod:fn"` (no
    arguments; returns the folder of a small built-in checkpoint, served when no model is given;
    `demo_priority=N`, default 0, ranks it when several lines offer one and `--demo LINE` does
    not choose),
    `tool_parser="name"` / `reasoning_parser="name"` (the parsers this line's output format
    needs: the server uses the tool parser by default and suggests the reasoning parser),
    `chat_encoder="module:Class"` (a class implementing
    `openinfer_core.interfaces.chat.ChatEncoder`, built with no arguments: when given, the
    server renders every chat prompt with it instead of the checkpoint's chat template; for
    formats that are code, such as DeepSeek-V4's) (`--load-format dummy` needs nothing from
    the line: its `load` reads tensors through
    `openinfer_core.weights.checkpoint.open_checkpoint`, which makes them up at the asked
    shapes)."""


@hookspec
def openinfer_register_schedulers(register: RegisterScheduler) -> None:
    """Add scheduling policies: `register(name, target)`, where `target` names a class
    implementing `openinfer_core.interfaces.scheduler.Scheduler`. Chosen with `--scheduler`."""


@hookspec
def openinfer_register_offload_tiers(register: RegisterOffloadTier) -> None:
    """Add KV offload tiers below device memory: `register(name, target)`, where `target`
    names a class implementing `openinfer_core.interfaces.offload.OffloadTier`."""


@hookspec
def openinfer_register_attention_backends(register: RegisterAttentionBackend) -> None:
    """Add attention backends: `register(name, target, devices=("cpu", "cuda"), priority=0)`,
    where `target` names a class implementing
    `openinfer_core.interfaces.attention.AttentionBackend`. For a device, the available backend
    of highest priority is the default."""


@hookspec
def openinfer_register_tool_parsers(register: RegisterParser) -> None:
    """Add tool-call parsers: `register(name, target)`, where `target` names a class
    implementing `openinfer_core.interfaces.parsers.ToolParserFactory` (built per response
    choice as `cls(tools=...)`, fed the output text). Chosen with `--tool-call-parser`, or by a
    model line's `tool_parser=` default."""


@hookspec
def openinfer_register_reasoning_parsers(register: RegisterParser) -> None:
    """Add reasoning parsers: `register(name, target)`, where `target` names a class
    implementing `openinfer_core.interfaces.parsers.ReasoningParserFactory` (built per
    response choice as `cls(prompt=...)`, fed the output text, splitting reasoning from
    content). Chosen with `--reasoning-parser`."""


@hookspec
def openinfer_register_kernel_compilers(register: RegisterKernelCompiler) -> None:
    """Add what compiles kernels ahead of their first launch: `register(name, target,
    sources=("package", ...))`, where `target` names a class implementing
    `openinfer_core.interfaces.kernel_compiler.KernelCompiler` (built with no arguments; several
    names may share one target, which is built once) and `sources` names the packages whose
    kernels it compiles. A digest of every registration's sources, with each compiler's
    version, names the mark a start that compiled ahead leaves: a change to any of them makes
    the next start compile again. Start-up uses them for models that declare
    `compile_ahead_safe`; the engine process starts their workers before importing torch."""
