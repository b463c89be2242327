"""One compile-ahead round for every forward that start-up runs, before it runs any.

Start-up runs forwards in three phases (the memory profile, each CUDA graph's warm-up, the
eager warm-up steps). Compiling ahead phase by phase would take three pools, each waiting for
its slowest kernel while the others idle. So on a cold start, right after the weights load,
this runs all of those forwards at once inside the kernel compilers' `compiling()` over a
scratch KV cache: the profile's step in its fresh blocks, every graph bucket's and every
warm-up step's in block 0, as their phases will lay them out; then the sampler's kernels'
warm-up. The phases then only run; a kernel variant this could not foresee compiles at its
first launch, as without compile-ahead, never a wrong result."""

from __future__ import annotations

import logging
import time

import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.cuda_graphs import new_graph_runner
from openinfer_core.interfaces.capabilities import sampling_kernels_of
from openinfer_core.interfaces.model import ForwardBatch, HostBatch, Model
from openinfer_core.sampling.sampler import warm_up_kernels
from openinfer_core.startup.compile_plan import CompilePlan
from openinfer_core.startup.eager_warmup import warm_up_batches
from openinfer_core.startup.memory_budget import profile_batch

log = logging.getLogger("openinfer")


def start_batches(config: EngineConfig, model: Model,
                  profile: HostBatch) -> list[ForwardBatch]:
    """On the device: the profile's step, every CUDA-graph bucket's batch, the warm-up steps
    (they need a KV cache of the profile step's blocks while they run)."""
    graphs = new_graph_runner(config, model)
    mixed_max = graphs.mixed[-1] if graphs is not None and graphs.mixed else 0
    return [profile.to_device(model.device),
            *(graphs.every_batch() if graphs is not None else []),
            *warm_up_batches(config, model, mixed_max)]


def compile_start_kernels(config: EngineConfig, model: Model, plan: CompilePlan) -> float:
    """Compile ahead, in one round, the kernels of every start-up forward (only when `plan`
    is active); the seconds it took."""
    if not plan.active or model.device.type != "cuda":
        return 0.0
    started = time.perf_counter()
    profile = profile_batch(config, model)
    model.create_kv_cache(int(profile.block_tables.max()) + 1, config.block_size)
    batches = start_batches(config, model, profile)
    # The sampler's kernels too (their warm-up launches each variant once).
    kernels = sampling_kernels_of(model)
    compiling = time.perf_counter()
    with torch.inference_mode(), plan.compilers.compiling():
        for batch in batches:
            model.forward(batch)  # compiled, not launched: the outputs are thrown away
        warm_up_kernels(kernels, model.device, model.vocab_size)
    torch.cuda.synchronize(model.device)
    log.info("compiled ahead the kernels of %d start-up forwards in %.2f s", len(batches),
             time.perf_counter() - compiling)
    plan.compilers.stop_workers()  # their work is done: give their memory back now
    model.create_kv_cache(2, config.block_size)  # drop the scratch cache
    torch.cuda.empty_cache()
    return time.perf_counter() - started
