"""The whole of a third-party model plugin: one hook, one line."""

from __future__ import annotations

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterModel


@hookimpl
def openinfer_register_models(register: RegisterModel) -> None:
    register("toy-counter", "openinfer_toy.model:ToyCounterLine",
             architectures=("ToyCounterForCausalLM",), model_types=("toy-counter",))
