"""openinfer-deepseek-v4's entry point: registers the model line."""

from __future__ import annotations

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterModel


@hookimpl
def openinfer_register_models(register: RegisterModel) -> None:
    register("deepseek-v4", "openinfer_deepseek_v4.model_line:DeepseekV4ModelLine",
             architectures=("DeepseekV4ForCausalLM",), model_types=("deepseek_v4",))
