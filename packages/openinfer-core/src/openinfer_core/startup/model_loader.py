"""From a checkpoint folder to a loaded model: pick the model line and the attention backend,
load the weights (on every rank, under tensor parallelism)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.capabilities import (
    supports_expert_parallel,
    supports_fp8_kv_cache,
    supports_online_quantization,
)
from openinfer_core.interfaces.model import LoadOptions, Model
from openinfer_core.model_config import read_json_if_present, read_model_config
from openinfer_core.plugins import PluginManager
from openinfer_core.startup.host_memory import resident_mb
from openinfer_core.weights.quantization import online_method

log = logging.getLogger("openinfer")
# The attention backend when the config names none (vLLM's VLLM_ATTENTION_BACKEND); unset: the
# registered backend of highest priority for the device.
ATTENTION_BACKEND_ENV = "OPENINFER_ATTENTION_BACKEND"


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Model
    attention_backend: str
    eos_token_ids: tuple[int, ...]
    hf_config: dict[str, Any]
    seconds: float  # loading the weights
    imports_mb: float  # resident host memory before the weights, all imports done


def eos_token_ids(model_dir: Path, config: dict[str, Any]) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (int or list), else config.json's."""
    gen = read_json_if_present(model_dir / "generation_config.json")
    raw = gen.get("eos_token_id", config.get("eos_token_id"))
    ids = raw if isinstance(raw, list) else [raw] if raw is not None else []
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ModelConfigError(f"eos_token_id must be an int or a list of ints, got {raw!r}")
    return tuple(ids)


def load_model(config: EngineConfig, plugins: PluginManager) -> LoadedModel:
    """The model line matching `config.model`'s config.json, its weights loaded on the device
    with the chosen attention backend."""
    model_dir = Path(config.model)
    hf_config = read_model_config(model_dir)
    entry = plugins.registries.models.match(hf_config)
    device = config.torch_device()
    if device.type == "cuda" and device.index is not None:
        # Triton launches and CUDA graph captures go to the current device: make it this
        # engine's (a data-parallel replica runs on cuda:N of its process).
        torch.cuda.set_device(device)
    dtype = config.torch_dtype(device, hf_config.get("torch_dtype") or hf_config.get("dtype"))
    regs = plugins.registries
    backend_name = (config.attention_backend or os.environ.get(ATTENTION_BACKEND_ENV)
                    or regs.default_attention_backend(device.type))
    attention = regs.attention_backends.resolve(backend_name)()
    log.info("loading %s with model line %r (%s, %s, attention=%s)", model_dir, entry.name,
             device, dtype, backend_name)
    start = time.perf_counter()
    imports_mb = resident_mb()
    quantization = online_method(config.quantization, hf_config)
    asked = config.quantization
    if asked is not None and not supports_online_quantization(entry.load(), asked):
        raise ModelConfigError(
            f"model line {entry.name!r} does not quantize weights at load: leave out "
            f"--quantization {asked} (its checkpoints load as stored)")
    options = LoadOptions(
        device=device, dtype=dtype, attention=attention, max_model_len=config.max_model_len,
        load_format="dummy" if config.load_format == "dummy" else "safetensors",
        quantization=quantization,
        expert_parallel=config.enable_expert_parallel and config.tensor_parallel_size > 1,
        kv_cache_dtype=config.torch_kv_cache_dtype())
    model: Model
    if options.kv_cache_dtype is not None and not supports_fp8_kv_cache(entry.load()):
        raise ModelConfigError(
            f"model line {entry.name!r} has no FP8 KV cache (its KV pages keep their own "
            f"layout): leave out --kv-cache-dtype {config.kv_cache_dtype}, or use auto")
    if config.enable_expert_parallel and not supports_expert_parallel(entry.load()):
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
    return LoadedModel(model, backend_name, eos_token_ids(model_dir, hf_config),
                       hf_config, time.perf_counter() - start, imports_mb)
