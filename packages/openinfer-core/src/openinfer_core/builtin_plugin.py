"""openinfer-core's own contributions, registered through the same hooks as any plugin."""

from __future__ import annotations

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterScheduler


@hookimpl
def openinfer_register_schedulers(register: RegisterScheduler) -> None:
    register("fcfs", "openinfer_core.engine.scheduler:FcfsScheduler")
    register("priority", "openinfer_core.engine.priority_scheduler:PriorityScheduler")
