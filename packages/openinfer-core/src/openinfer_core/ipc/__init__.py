"""The engine in its own process: the engine-core loop, its launcher, and the `EngineHandle`
frontends use to reach it over ZeroMQ; with data parallelism, the router over several."""

from openinfer_core.ipc.client import EngineClient
from openinfer_core.ipc.engine_core import EngineAddresses
from openinfer_core.ipc.process import EngineProcess, EngineStartError
from openinfer_core.ipc.router import ReplicaRouter

__all__ = ["EngineAddresses", "EngineClient", "EngineProcess", "EngineStartError",
           "ReplicaRouter"]
