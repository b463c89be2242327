"""openinfer-qwen35's entry point: registers the model line, nothing else."""

from __future__ import annotations

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterModel


@hookimpl
def openinfer_register_models(register: RegisterModel) -> None:
    register("qwen3.5", "openinfer_qwen35.model_line:Qwen35ModelLine",
             architectures=("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
             model_types=("qwen3_5_text", "qwen3_5"),
             demo="openinfer_qwen35.demo:demo_checkpoint", demo_priority=5,
             tool_parser="hermes", reasoning_parser="qwen3")
