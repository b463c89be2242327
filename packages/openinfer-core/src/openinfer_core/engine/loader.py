"""From a checkpoint folder to a running model: pick the model line, the attention backend,
load weights, size and allocate the KV cache."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from openinfer_core.engine import compile_ahead
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.host_memory import resident_mb
from openinfer_core.engine.memory import StepMemory, profile_key, step_memory
from openinfer_core.engine.start_kernels import compile_start_kernels
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import LoadOptions, Model
from openinfer_core.interfaces.offload import OFFLOAD_DEVICE_BYTES
from openinfer_core.model_config import read_json_if_present, read_model_config
from openinfer_core.plugins import PluginManager

log = logging.getLogger("openinfer")
# The attention backend when the config names none (vLLM's VLLM_ATTENTION_BACKEND); unset: the
# registered backend of highest priority for the device.
ATTENTION_BACKEND_ENV = "OPENINFER_ATTENTION_BACKEND"


@dataclass(slots=True)
class LoadedEngineParts:
    model: Model
    kv: KVManager
    model_line: str
    eos_token_ids: tuple[int, ...]
    hf_config: dict[str, Any]
    seconds: dict[str, float]  # start-up phases: "weights", "kv_cache"
    resident_mb: dict[str, float]  # the process's resident host memory after each phase
    # How the step's memory was budgeted (CUDA only): a cached value is checked by the warm-up.
    step_memory: StepMemory | None = None


def eos_token_ids(model_dir: Path, config: dict[str, Any]) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (int or list), else config.json's."""
    gen = read_json_if_present(model_dir / "generation_config.json")
    raw = gen.get("eos_token_id", config.get("eos_token_id"))
    ids = raw if isinstance(raw, list) else [raw] if raw is not None else []
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ModelConfigError(f"eos_token_id must be an int or a list of ints, got {raw!r}")
    return tuple(ids)


def load_engine_parts(config: EngineConfig, plugins: PluginManager) -> LoadedEngineParts:
    model_dir = Path(config.model)
    hf_config = read_model_config(model_dir)
    entry = plugins.registries.models.match(hf_config)
    device = config.torch_device()
    dtype = config.torch_dtype(device, hf_config.get("torch_dtype") or hf_config.get("dtype"))
    regs = plugins.registries
    backend_name = (config.attention_backend or os.environ.get(ATTENTION_BACKEND_ENV)
                    or regs.default_attention_backend(device.type))
    attention = regs.attention_backends.resolve(backend_name)()
    log.info("loading %s with model line %r (%s, %s, attention=%s)", model_dir, entry.name,
             device, dtype, backend_name)
    start = time.perf_counter()
    imported_mb = resident_mb()
    options = LoadOptions(
        device=device, dtype=dtype, attention=attention, max_model_len=config.max_model_len,
        load_format="dummy" if config.load_format == "dummy" else "safetensors",
        expert_parallel=config.enable_expert_parallel and config.tensor_parallel_size > 1)
    model: Model
    if config.enable_expert_parallel and not getattr(entry.load(), "supports_expert_parallel",
                                                     False):
        raise ModelConfigError(
            f"model line {entry.name!r} has no routed experts to split over ranks: leave out "
            "--enable-expert-parallel")
    if config.tensor_parallel_size > 1:
        from openinfer_core.distributed import TensorParallelModel
        from openinfer_core.distributed.nodes import NodeLayout

        layout = NodeLayout(config.nnodes, config.node_rank, config.master_addr,
                            config.master_port)
        model = TensorParallelModel.start(entry.load(), model_dir, hf_config, options,
                                          config.tensor_parallel_size, layout=layout)
    else:
        model = entry.load().load(model_dir, hf_config, options)
    loaded = time.perf_counter()
    loaded_mb = resident_mb()
    key = profile_key(config, model, hf_config, backend_name) if device.type == "cuda" else {}
    compile_ahead.plan(model, key)
    compiled = compile_start_kernels(config, model)
    compiled_at = time.perf_counter()
    step = (step_memory(config, model, key)
            if device.type == "cuda" and config.num_kv_blocks is None else None)
    num_blocks = kv_blocks(config, model, device, step)
    kv = model.create_kv_cache(num_blocks, config.block_size)
    kv.enable_prefix_caching = config.enable_prefix_caching
    log.info("KV cache: %d blocks of %d tokens (%d tokens), prefix caching %s",
             kv.num_total_blocks, config.block_size, kv.num_total_blocks * config.block_size,
             "on" if config.enable_prefix_caching else "off")
    seconds = {"weights": loaded - start, "compile_ahead": compiled,
               "kv_cache": time.perf_counter() - compiled_at}
    resident = {"imports": imported_mb, "weights": loaded_mb, "kv_cache": resident_mb()}
    return LoadedEngineParts(model, kv, entry.name, eos_token_ids(model_dir, hf_config),
                             hf_config, seconds, resident, step)


def kv_blocks(config: EngineConfig, model: Model, device: torch.device,
              step: StepMemory | None = None) -> int:
    """Blocks (padding included) that fit the memory budget, but no more than every sequence
    at full length could use. `step`: what a step needs besides (CUDA: required)."""
    per_block = model.kv_bytes_per_block(config.block_size)
    useful = config.max_num_seqs * -(-model.max_model_len // config.block_size) + 1
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if device.type == "cuda":
        if step is None:
            raise ValueError("kv_blocks on CUDA needs the step's memory")
        free, total = torch.cuda.mem_get_info(device)
        # Keep (1 - utilization) of the card untouched, and room for the largest step (and
        # for the offload tiers' staging buffer).
        budget = free - (1.0 - config.gpu_memory_utilization) * total - step.bytes
        if config.kv_offload:
            budget -= OFFLOAD_DEVICE_BYTES
    else:
        budget = config.cpu_kv_cache_gib * (1 << 30)
    blocks = min(int(budget // per_block), useful)
    if blocks < 2:
        raise ModelConfigError(
            f"no memory left for the KV cache (one block needs {per_block} bytes); lower "
            "max_model_len or raise gpu_memory_utilization / cpu_kv_cache_gib"
        )
    return blocks
