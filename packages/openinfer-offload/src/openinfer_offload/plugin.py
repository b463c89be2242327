"""Registers the built-in tiers. Lazy: nothing here imports torch."""

from __future__ import annotations

from typing import Any

from openinfer_core.hookspecs import hookimpl


@hookimpl
def openinfer_register_offload_tiers(register: Any) -> None:
    register("host", "openinfer_offload.host:HostTier", first=True)
    register("disk", "openinfer_offload.disk:DiskStore", first=False)
