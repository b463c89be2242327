"""Bringing an engine up, from the plugins to a model ready for its first step, in this order:

1. load the model (model_loader.py);
2. on a cold start, compile ahead, in one round, every kernel start-up will run
   (compile_plan.py, compile_round.py, through the registered kernel_compilers.py);
3. measure (or read back, measurement_cache.py) what a step needs, and give the KV cache what
   is left (memory_budget.py); `max_model_len` is lowered to what it holds, or the start
   refused, when it cannot hold one sequence;
4. build the KV offload tiers and warm up the sampler's kernels;
5. capture the CUDA graphs a start needs (engine/cuda_graphs.py; with `defer_graphs` the rest
   are left to the engine's idle time) and warm up the eager step shapes (eager_warmup.py);
6. stamp what compiled, and log where the time and the host memory went; from then on, log
   any kernel that still compiles (core's late_compiles.py; `SupportsStarted` tells a
   model's own processes to do the same).

What the engine does with idle time after (host_memory.py, the deferred graphs) is its own."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.cuda_graphs import CudaGraphRunner, new_graph_runner
from openinfer_core.engine.offload import KVOffload
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.capabilities import (
    create_kv_cache_of,
    has_state_groups,
    sampling_kernels_of,
    side_groups_of,
    supports_close,
    supports_started,
)
from openinfer_core.interfaces.kv import GroupedKV, KVManager
from openinfer_core.interfaces.model import Model
from openinfer_core.late_compiles import log_late_compiles
from openinfer_core.plugins import PluginManager
from openinfer_core.sampling.sampler import warm_up_kernels
from openinfer_core.startup import measurement_cache
from openinfer_core.startup.compile_plan import plan_compile
from openinfer_core.startup.compile_round import compile_start_kernels
from openinfer_core.startup.eager_warmup import warm_up_eager_steps
from openinfer_core.startup.host_memory import resident_mb
from openinfer_core.startup.kernel_compilers import KernelCompilers
from openinfer_core.startup.memory_budget import (
    StepMemory,
    fit_max_model_len,
    kv_blocks,
    kv_step_limits,
    profile_key,
    step_memory,
)
from openinfer_core.startup.model_loader import load_model

log = logging.getLogger("openinfer")

# "start" (the default): a serving engine captures only the graphs a start needs most and the
# rest when idle; "all": every graph before ready. Under load from the first second the two
# serve the same throughput on the H100 (Qwen3-8B, 128/128 x 1024 at concurrency 512:
# `gpu_check.sh serve`, with and without OPENINFER_CUDA_GRAPHS_AT_START=all).
GRAPHS_AT_START_ENV = "OPENINFER_CUDA_GRAPHS_AT_START"


@dataclass(frozen=True, slots=True)
class StartedEngine:
    """What the engine runs on, and where its start-up went."""

    model: Model
    kv: KVManager
    eos_token_ids: tuple[int, ...]
    hf_config: dict[str, Any]
    offload: KVOffload | None
    graphs: CudaGraphRunner | None  # graphs.pending: those left to capture when idle
    # Start-up phases: weights, compile_ahead, kv_cache, cuda_graphs, warm_up, other.
    seconds: dict[str, float]


def bring_up(config: EngineConfig, plugins: PluginManager, *,
             defer_graphs: bool = False) -> StartedEngine:
    """Load, size and warm up everything a step needs (steps 1-6 above). `defer_graphs`:
    capture only the CUDA graphs a start needs most (unless OPENINFER_CUDA_GRAPHS_AT_START is
    "all"). Raises what loading raises; a user's mistake as an `OpenInferError`."""
    start = time.perf_counter()
    loaded = load_model(config, plugins)
    model = loaded.model
    check_kv_offload(config, model)
    seconds = {"weights": loaded.seconds}
    resident = {"imports": loaded.imports_mb, "weights": resident_mb()}
    key = (profile_key(config, model, loaded.hf_config, loaded.attention_backend)
           if model.device.type == "cuda" else {})
    plan = plan_compile(model, key, KernelCompilers.from_plugins(plugins))
    seconds["compile_ahead"] = compile_start_kernels(config, model, plan)
    sized = time.perf_counter()
    step = step_memory(config, model, key)
    kv = _allocate_kv(config, model, step)
    seconds["kv_cache"] = time.perf_counter() - sized
    resident["kv_cache"] = resident_mb()
    offload = KVOffload.build(config, plugins, model, kv, loaded.hf_config)
    warm_up_kernels(sampling_kernels_of(model), model.device, model.vocab_size)
    defer = defer_graphs and os.environ.get(GRAPHS_AT_START_ENV, "start") == "start"
    graphs = _first_steps(config, model, step, defer, seconds, resident)
    plan.finish()
    seconds["other"] = time.perf_counter() - start - sum(seconds.values())
    _log_ready(time.perf_counter() - start, seconds, resident)
    if model.device.type == "cuda":
        log_late_compiles()
    if supports_started(model):  # its other processes log their late compiles too
        model.started()
    return StartedEngine(model, kv, loaded.eos_token_ids, loaded.hf_config, offload, graphs,
                         seconds)


def _allocate_kv(config: EngineConfig, model: Model, step: StepMemory | None) -> KVManager:
    kv = create_kv_cache_of(model, kv_blocks(config, model, model.device, step),
                            config.block_size, kv_step_limits(config))
    # A recurrent state is kept at the last computed token only: a cached prefix would come
    # without the state at its end (`GroupedKV`), so hybrid models cache no prefix.
    stateful = has_state_groups(model)
    kv.enable_prefix_caching = config.enable_prefix_caching and not stateful
    fit_max_model_len(config, model, kv)
    log.info("KV cache: %d blocks of %d tokens (%d tokens), prefix caching %s",
             kv.num_total_blocks, config.block_size, kv.num_total_blocks * config.block_size,
             "on" if kv.enable_prefix_caching
             else "off (the model keeps a recurrent state per request, which is not cached "
                  "at block boundaries)" if config.enable_prefix_caching and stateful
             else "off")
    if isinstance(kv, GroupedKV) and len(kv.groups) > 1:
        log.info("KV groups: %s", ", ".join(
            f"{u.name} {u.total} blocks" for u in kv.group_usage()))
    return kv


def check_kv_offload(config: EngineConfig, model: Model) -> None:
    """Refuse `--kv-offload` for a model with recurrent-state KV groups: a state is kept only
    at a request's last token, so there is no block-boundary copy to save. Window groups are
    saved and restored group by group (`engine.offload_tiers`)."""
    states = tuple(g for g in side_groups_of(model) if g.state)
    if config.kv_offload and states:
        if supports_close(model):  # tensor-parallel ranks already started
            model.close()
        raise ModelConfigError(
            f"--kv-offload: model {config.model!r} keeps KV in recurrent-state groups "
            f"({', '.join(g.name for g in states)}), which the offload tiers cannot save or "
            "restore: leave out --kv-offload")


def _first_steps(config: EngineConfig, model: Model, step: StepMemory | None, defer: bool,
                 seconds: dict[str, float],
                 resident: dict[str, float]) -> CudaGraphRunner | None:
    """Capture the CUDA graphs, then the eager warm-up steps, timed. They run the largest
    steps after the KV cache took its memory: if the step's memory came from the start-up
    cache and they run out, the cached value was wrong; it is dropped, so that the next
    start measures again."""
    try:
        started = time.perf_counter()
        graphs = new_graph_runner(config, model)
        if graphs is not None:
            graphs.capture(start_only=defer)
        seconds["cuda_graphs"] = time.perf_counter() - started
        resident["cuda_graphs"] = resident_mb()
        started = time.perf_counter()
        warm_up_eager_steps(config, model, graphs.mixed[-1]
                            if graphs is not None and graphs.mixed else 0)
        seconds["warm_up"] = time.perf_counter() - started
        resident["warm_up"] = resident_mb()
    except torch.OutOfMemoryError:
        key = step.cache_key if step is not None else None
        if key is None:
            raise
        measurement_cache.drop("step-memory", key)
        raise RuntimeError(
            "the largest step ran out of device memory with the step memory read from the "
            f"start-up cache ({measurement_cache.cache_dir()}); the entry is dropped: start "
            "again to measure it") from None
    return graphs


def _log_ready(total: float, seconds: dict[str, float], resident: dict[str, float]) -> None:
    """Where the start-up went, for the log and benchmarks/device/startup.py."""
    log.info("engine ready in %.2f s (%s)", total, ", ".join(
        f"{name.replace('_', ' ')} {value:.2f} s" for name, value in seconds.items()))
    log.info("resident host memory after each start-up phase, MB: %s", ", ".join(
        f"{name.replace('_', ' ')} {mb:.0f}" for name, mb in resident.items()))
