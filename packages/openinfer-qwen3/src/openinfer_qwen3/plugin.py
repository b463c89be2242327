"""openinfer-qwen3's entry point: registers the model line, nothing else."""

from __future__ import annotations

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterModel


@hookimpl
def openinfer_register_models(register: RegisterModel) -> None:
    register("qwen3", "openinfer_qwen3.model_line:Qwen3ModelLine",
             architectures=("Qwen3ForCausalLM",), model_types=("qwen3",),
             demo="openinfer_qwen3.demo:demo_checkpoint", demo_priority=10,
             tool_parser="hermes", reasoning_parser="qwen3")
