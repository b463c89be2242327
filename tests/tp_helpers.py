"""Building tensor-parallel engines in tests before `EngineConfig.tensor_parallel_size`
exists: a model line that loads Qwen3 over N ranks, registered as a test plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from openinfer_core import Engine, EngineConfig
from openinfer_core.distributed import TensorParallelModel
from openinfer_core.hookspecs import hookimpl
from openinfer_core.interfaces.model import LoadOptions
from openinfer_core.plugins import PluginManager
from openinfer_core.registry import RegisterModel
from openinfer_qwen3.model_line import Qwen3ModelLine


class Qwen3TensorParallel2:
    """Qwen3 on 2 ranks."""

    name: ClassVar[str] = "qwen3-tp2"

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any],
             options: LoadOptions) -> TensorParallelModel:
        return TensorParallelModel.start(Qwen3ModelLine, model_dir, config, options, 2,
                                         timeout_s=30.0)


class _Plugin:
    @hookimpl
    def openinfer_register_models(self, register: RegisterModel) -> None:
        register("qwen3-tp2", "tp_helpers:Qwen3TensorParallel2",
                 architectures=("Qwen3ForCausalLM",))


def tp2_engine(model_dir: Path, **config: Any) -> Engine:
    """An engine whose model runs on 2 ranks (gloo on CPU). `engine.model.close()` after."""
    plugins = PluginManager(autoload=True, allowlist={"core", "kernels"}, plugins=[_Plugin()])
    return Engine(EngineConfig(model=str(model_dir), device="cpu", **config), plugins)


def run_after_a_rank_died(engine: Engine, request_ids: list[str]) -> None:
    """Step `engine` until its requests end after a rank died: each ends with the tensor-
    parallel failure as its error, or a step raises ModelFailedError (which stops a serving
    engine); at most 100 steps, so nothing waits on the dead rank."""
    from openinfer_core.events import Error, TokenEvent
    from openinfer_core.interfaces.model import ModelFailedError

    events: list[TokenEvent] = []
    try:
        for _ in range(100):
            if not engine.has_work():
                break
            events += engine.step()
    except ModelFailedError as exc:
        assert "rank" in str(exc)
    else:
        errors = {e.request_id: e.message for e in events if isinstance(e, Error)}
        assert sorted(errors) == sorted(request_ids)
        assert all("tensor parallelism failed" in m for m in errors.values()), errors
