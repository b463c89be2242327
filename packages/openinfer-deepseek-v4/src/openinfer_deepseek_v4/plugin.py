"""openinfer-deepseek-v4's entry point: registers the model line (with its chat encoding, tool
parser, reasoning parser and demo checkpoint) and the DSML tool-call parser."""

from __future__ import annotations

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterModel, RegisterParser


@hookimpl
def openinfer_register_models(register: RegisterModel) -> None:
    register("deepseek-v4", "openinfer_deepseek_v4.model_line:DeepseekV4ModelLine",
             architectures=("DeepseekV4ForCausalLM",), model_types=("deepseek_v4",),
             chat_encoder="openinfer_deepseek_v4.chat.encoding:DeepseekV4ChatEncoder",
             tool_parser="deepseek_v4", reasoning_parser="deepseek_r1",
             demo="openinfer_deepseek_v4.demo:demo_checkpoint")


@hookimpl
def openinfer_register_tool_parsers(register: RegisterParser) -> None:
    register("deepseek_v4", "openinfer_deepseek_v4.chat.tool_parser:DeepseekV4ToolParser")
