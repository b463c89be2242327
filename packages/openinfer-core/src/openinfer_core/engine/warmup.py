"""Compiling, at start, the kernels of steps that run eagerly, so that no step of a running
engine waits on the JIT (Triton compiles a kernel variant per tile setting on first use, ~1 s
each; CUDA loads cuBLAS kernels on first use too).

Decode and small mixed steps are warmed by the CUDA-graph capture, long prompts by the memory
profile. What is left are eager steps of many short requests (a burst of new prompts beside
decodes): their attention takes the short-query kernel at token counts no graph has. One eager
forward at the smallest and one at the largest such count compiles them; every token writes
into the padding block 0 and the outputs are thrown away."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from openinfer_core.engine.batch import HostBatch
from openinfer_core.engine.config import EngineConfig
from openinfer_core.interfaces.model import Model

log = logging.getLogger("openinfer")

SHORT_QUERY = 64  # tokens per request in the warm-up steps


def warm_up_eager_steps(config: EngineConfig, model: Model, graph_max_tokens: int) -> None:
    if model.device.type != "cuda":
        return  # no JIT on the CPU path
    started = time.perf_counter()
    largest = min(config.max_num_batched_tokens, config.max_num_seqs * SHORT_QUERY)
    counts = sorted({min(largest, graph_max_tokens + SHORT_QUERY), largest})
    with torch.inference_mode():
        for num_tokens in counts:
            if num_tokens > graph_max_tokens:
                model.forward(short_requests(num_tokens, config.block_size)
                              .to_device(model.device))
    torch.cuda.synchronize(model.device)
    log.info("warm-up: eager steps of %s tokens in %.2f s", " and ".join(map(str, counts)),
             time.perf_counter() - started)


def short_requests(num_tokens: int, block_size: int) -> HostBatch:
    """`num_tokens` tokens as requests of `SHORT_QUERY` new tokens each (the last shorter),
    every one in the padding block 0, each sampling its last token."""
    lens = [SHORT_QUERY] * (num_tokens // SHORT_QUERY)
    if num_tokens % SHORT_QUERY:
        lens.append(num_tokens % SHORT_QUERY)
    starts = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=starts[1:])
    positions = np.concatenate([np.arange(n) for n in lens]).astype(np.int64)
    width = -(-SHORT_QUERY // block_size)
    return HostBatch(
        input_ids=np.zeros(num_tokens, dtype=np.int64), positions=positions,
        slot_mapping=positions % block_size,  # block 0
        query_start_loc=starts, seq_lens=np.array(lens, dtype=np.int32),
        block_tables=np.zeros((len(lens), width), dtype=np.int32),
        logits_indices=starts[1:].astype(np.int64) - 1,
        max_query_len=max(lens), max_seq_len=max(lens))
