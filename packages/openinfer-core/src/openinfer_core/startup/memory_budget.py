"""How the device's memory is split: what a step needs besides weights and KV, measured, not
guessed; the KV cache gets what is left.

Before the KV cache is sized, one forward of the largest step the scheduler can build
(`max_num_batched_tokens` tokens, `max_num_seqs` sampled rows) runs on a temporary KV cache;
its peak allocation is what activations need. The sampler's working copies of the logits, the
CUDA graphs' shared logits output and their memory pool are added on top.

The peak is kept in the start-up cache (measurement_cache.py): a later start of the same model,
limits, dtype and device reads it back, with a margin, and skips the forward.

A KV cache too small for one sequence of `max_model_len` tokens lowers `max_model_len` to what
it holds, with a warning, when the user left it to the model; when they set it, the start is
refused with what to change (as vLLM does).

A model with window or state KV groups (`capabilities.SupportsKVGroups`) sizes their pools
for the step limits; their bytes (`kv_window_bytes`) come off the budget first, and the full
groups' blocks take the rest."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from openinfer_core.engine.batch import scratch_group_tables
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.cuda_graphs import GRAPH_MAX_BATCH
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.capabilities import (
    kv_groups_of,
    supports_cuda_graphs,
    supports_kv_groups,
)
from openinfer_core.interfaces.kv import KVManager, KVStepLimits
from openinfer_core.interfaces.model import HostBatch, Model
from openinfer_core.interfaces.offload import OFFLOAD_DEVICE_BYTES
from openinfer_core.startup import measurement_cache

log = logging.getLogger("openinfer")

_SAMPLER_LOGIT_COPIES = 4  # penalised copy, scaled copy, sorted values and their order
_GRAPH_POOL_MARGIN = 256 << 20  # the graphs' intermediates, beside the one logits buffer


def profile_batch(config: EngineConfig, model: Model) -> HostBatch:
    """The largest step: `max_num_batched_tokens` in fresh blocks, `max_num_seqs` sampled
    (with a state KV group, scratch slots: `batch.scratch_group_tables`)."""
    num_tokens = config.max_num_batched_tokens
    batch = _profile_batch(num_tokens, min(config.max_num_seqs, num_tokens),
                           model.max_model_len, config.block_size)
    batch.group_block_tables = scratch_group_tables(kv_groups_of(model), batch.block_tables)
    return batch


def _profile_batch(num_tokens: int, num_logits: int, max_len: int, block_size: int) -> HostBatch:
    """Sequences of at most `max_len` tokens filling `num_tokens`, in fresh blocks 1, 2, ..."""
    lens = [max_len] * (num_tokens // max_len) + ([num_tokens % max_len] if num_tokens % max_len
                                                  else [])
    width = max(-(-n // block_size) for n in lens)
    tables = np.zeros((len(lens), width), dtype=np.int32)
    next_block = 1
    for b, n in enumerate(lens):
        used = -(-n // block_size)
        tables[b, :used] = np.arange(next_block, next_block + used)
        next_block += used
    positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int64)
    rows = np.repeat(np.arange(len(lens)), lens)
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return HostBatch(
        input_ids=np.zeros(num_tokens, dtype=np.int64), positions=positions,
        slot_mapping=tables[rows, positions // block_size].astype(np.int64) * block_size
        + positions % block_size,
        query_start_loc=starts, seq_lens=np.array(lens, dtype=np.int32), block_tables=tables,
        logits_indices=np.arange(num_tokens - num_logits, num_tokens, dtype=np.int64),
        max_query_len=max(lens), max_seq_len=max(lens))


@dataclass(frozen=True, slots=True)
class StepMemory:
    """Bytes a step needs beyond weights and KV; `cache_key` is set when they came from the
    start-up cache (so a start that proves them wrong can drop the entry)."""

    bytes: int
    cache_key: dict[str, Any] | None = None


def profile_key(config: EngineConfig, model: Model, hf_config: dict[str, Any],
                attention: str) -> dict[str, Any]:
    """What the forward's peak depends on (measurement_cache.py's key for it)."""
    device = model.device
    props = torch.cuda.get_device_properties(device)
    return {
        "hf_config": hf_config, "model": f"{type(model).__module__}.{type(model).__qualname__}",
        "model_source": measurement_cache.source_digest(model), "attention": attention,
        "dtype": config.dtype, "kv_cache_dtype": config.kv_cache_dtype,
        "max_model_len": model.max_model_len,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "max_num_seqs": config.max_num_seqs, "block_size": config.block_size,
        "device": props.name, "device_memory": props.total_memory,
        "torch": torch.__version__, "env": measurement_cache.kernel_env(),
    }


def step_memory(config: EngineConfig, model: Model, key: dict[str, Any]) -> StepMemory | None:
    """Peak bytes one step needs on the device beyond weights and KV: the cached forward peak
    for `key` plus a margin, else measured (and stored). None where the KV cache is not sized
    by what is left (not on CUDA, or `num_kv_blocks` given)."""
    if model.device.type != "cuda" or config.num_kv_blocks is not None:
        return None
    cached = measurement_cache.load("step-memory", key)
    if cached is not None:
        forward_peak, source, cache_key = measurement_cache.with_margin(cached), "cached", key
    else:
        forward_peak, source, cache_key = profile_forward_peak(config, model), "measured", None
        measurement_cache.store("step-memory", key, forward_peak)
    sampler = _SAMPLER_LOGIT_COPIES * config.max_num_seqs * model.vocab_size * 4
    # The graphs' one fp32 logits buffer (cuda_graphs.py): max_batch rows, kept for good.
    captured = (not config.enforce_eager and not config.serves_embeddings()
                and supports_cuda_graphs(model)
                and model.cuda_graph_safe)
    graphs = 0 if not captured else (
        min(config.max_num_seqs, GRAPH_MAX_BATCH) * model.vocab_size * 4 + _GRAPH_POOL_MARGIN)
    log.info("step memory: forward of %d tokens peaks at %.2f GiB (%s); sampler %.2f GiB; "
             "CUDA graphs %.2f GiB", config.max_num_batched_tokens, forward_peak / 2**30,
             source, sampler / 2**30, graphs / 2**30)
    return StepMemory(forward_peak + sampler + graphs, cache_key)


def profile_forward_peak(config: EngineConfig, model: Model) -> int:
    """Peak bytes, above what is allocated now, of one forward of the largest step."""
    device = model.device
    batch = profile_batch(config, model)
    model.create_kv_cache(int(batch.block_tables.max()) + 1, config.block_size)
    on_device = batch.to_device(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        logits = model.forward(on_device)
        del logits
    torch.cuda.synchronize(device)
    forward_peak = torch.cuda.max_memory_allocated(device) - before
    model.create_kv_cache(2, config.block_size)  # drop the profiling cache
    torch.cuda.empty_cache()
    return int(forward_peak)


def kv_step_limits(config: EngineConfig) -> KVStepLimits:
    """What sizes a window or state KV group's pool: the scheduler's limits on one step."""
    return KVStepLimits(config.max_num_seqs, config.max_num_batched_tokens)


def kv_blocks(config: EngineConfig, model: Model, device: torch.device,
              step: StepMemory | None = None) -> int:
    """Blocks (padding included) of the full KV group(s) that fit the memory budget, after the
    window and state groups' pools (sized for the step limits), but no more than every
    sequence at full length could use. `step`: what a step needs besides (CUDA: required).
    `num_kv_blocks`, when set, is the full groups' count, the other pools come on top."""
    per_block = model.kv_bytes_per_block(config.block_size)
    useful = config.max_num_seqs * -(-model.max_model_len // config.block_size) + 1
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    windows = (model.kv_window_bytes(config.block_size, kv_step_limits(config))
               if supports_kv_groups(model) else 0)
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
    blocks = min(int((budget - windows) // per_block), useful)
    if blocks < 2:
        pools = (f", after {windows} bytes for the window and state KV groups' pools (lower "
                 "max_num_seqs / max_num_batched_tokens to shrink them)" if windows else "")
        raise ModelConfigError(
            f"no memory left for the KV cache (one block needs {per_block} bytes{pools}); "
            "lower max_model_len or raise gpu_memory_utilization / cpu_kv_cache_gib"
        )
    return blocks


def fit_max_model_len(config: EngineConfig, model: Model, kv: KVManager) -> None:
    """Make one sequence of `model.max_model_len` tokens fit the KV cache `kv`: lower
    `model.max_model_len` to the tokens `kv` holds (with a WARNING naming both) when
    `config.max_model_len` was left to the model; raise `ModelConfigError` saying what to
    change when the user set it. Mutates `model.max_model_len`."""
    block = kv.block_size
    holds = kv.num_total_blocks * block
    wanted = model.max_model_len
    if wanted <= holds:
        return
    need = -(-wanted // block)
    more = _more_kv_memory(config, model.device, need + 1)
    if config.max_model_len is None and holds >= 2:
        log.warning(
            "max_model_len lowered from %d (the model's) to %d tokens: the KV cache holds %d "
            "blocks of %d tokens, one sequence of %d tokens needs %d. For the full length, "
            "give the KV cache more memory (%s)", wanted, holds, kv.num_total_blocks, block,
            wanted, need, more)
        model.max_model_len = holds
        return
    raise ModelConfigError(
        f"max_model_len {wanted} does not fit the KV cache: one sequence of {wanted} tokens "
        f"needs {need} blocks of {block} tokens, the cache holds {kv.num_total_blocks} "
        f"({holds} tokens). Lower --max-model-len to {holds} or less, or give the KV cache "
        f"more memory ({more})")


def _more_kv_memory(config: EngineConfig, device: torch.device, blocks: int) -> str:
    """The settings that give the KV cache `blocks` blocks (padding included), or more."""
    if config.num_kv_blocks is not None:
        return f"--num-kv-blocks {blocks} or more, now {config.num_kv_blocks}"
    if device.type == "cuda":
        return (f"a higher --gpu-memory-utilization, now {config.gpu_memory_utilization}; "
                "or a smaller step: --max-num-batched-tokens, --max-num-seqs")
    return (f"EngineConfig.cpu_kv_cache_gib above {config.cpu_kv_cache_gib}, or "
            f"--num-kv-blocks {blocks}")
