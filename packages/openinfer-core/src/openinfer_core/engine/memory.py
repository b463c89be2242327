"""How much device memory a step needs besides weights and KV: measured, not guessed.

Before the KV cache is sized, one forward of the largest step the scheduler can build
(`max_num_batched_tokens` tokens, `max_num_seqs` sampled rows) runs on a temporary KV cache;
its peak allocation is what activations need. The sampler's working copies of the logits and
the CUDA graphs' own memory pool are added on top."""

from __future__ import annotations

import logging

import numpy as np
import torch

from openinfer_core.engine.batch import HostBatch
from openinfer_core.engine.compile_ahead import compile_ahead
from openinfer_core.engine.config import EngineConfig
from openinfer_core.interfaces.model import Model

log = logging.getLogger("openinfer")

_SAMPLER_LOGIT_COPIES = 4  # penalised copy, scaled copy, sorted values and their order
_GRAPH_POOL_MARGIN = 256 << 20


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


def step_memory_bytes(config: EngineConfig, model: Model) -> int:
    """Peak bytes one step needs on the device beyond weights and KV (CUDA only)."""
    device = model.device
    num_tokens = config.max_num_batched_tokens
    num_logits = min(config.max_num_seqs, num_tokens)
    batch = _profile_batch(num_tokens, num_logits, model.max_model_len, config.block_size)
    model.create_kv_cache(int(batch.block_tables.max()) + 1, config.block_size)
    on_device = batch.to_device(device)
    compile_ahead(model, [on_device], "memory-profile")
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
    sampler = _SAMPLER_LOGIT_COPIES * config.max_num_seqs * model.vocab_size * 4
    log.info("step memory: forward of %d tokens peaks at %.2f GiB; sampler %.2f GiB",
             num_tokens, forward_peak / 2**30, sampler / 2**30)
    return forward_peak + sampler + _GRAPH_POOL_MARGIN
