"""openinfer-core's own contributions, registered through the same hooks as any plugin."""

from __future__ import annotations

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterParser, RegisterScheduler


@hookimpl
def openinfer_register_schedulers(register: RegisterScheduler) -> None:
    register("fcfs", "openinfer_core.engine.scheduler:FcfsScheduler")
    register("priority", "openinfer_core.engine.priority_scheduler:PriorityScheduler")


@hookimpl
def openinfer_register_tool_parsers(register: RegisterParser) -> None:
    register("hermes", "openinfer_core.text.tool_parsers.hermes:HermesToolParser")


@hookimpl
def openinfer_register_reasoning_parsers(register: RegisterParser) -> None:
    register("qwen3", "openinfer_core.text.reasoning.think:Qwen3ReasoningParser")
    register("deepseek_r1", "openinfer_core.text.reasoning.think:DeepSeekR1ReasoningParser")
