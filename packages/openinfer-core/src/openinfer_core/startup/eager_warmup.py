"""Compiling, at start, the kernels of steps that run eagerly, so that no step of a running
engine waits on the JIT (Triton compiles a kernel variant per tile setting on first use, ~1 s
each; CUDA loads cuBLAS kernels on first use too).

Decode and mixed steps up to the largest graph are warmed by the CUDA-graph capture. What is
left are eager steps, larger than any graph: many short requests (a burst of new prompts
beside decodes), whose attention takes the short-query kernel, and prompt chunks, which take
the prefill kernel. Eager forwards of both kinds, at the smallest and the largest eager token
count, compile them, with a ladder of token counts between, on and off the multiples of 16
(`ladder_shapes`), and steps of decodes beside a prompt chunk (`mixed_steps`); every token
writes into the padding block 0 and the outputs are thrown away."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from openinfer_core.engine.batch import scratch_group_tables
from openinfer_core.engine.config import EngineConfig
from openinfer_core.interfaces.capabilities import kv_groups_of
from openinfer_core.interfaces.model import ForwardBatch, HostBatch, Model

log = logging.getLogger("openinfer")

SHORT_QUERY = 64  # tokens per request in the short-request warm-up steps
LONG_QUERY = 2048  # in the prompt-chunk ones


def warm_up_eager_steps(config: EngineConfig, model: Model, graph_max_tokens: int) -> None:
    if model.device.type != "cuda":
        return  # no JIT on the CPU path
    started = time.perf_counter()
    batches = warm_up_batches(config, model, graph_max_tokens)
    with torch.inference_mode():
        for batch in batches:
            model.forward(batch)
    torch.cuda.synchronize(model.device)
    log.info("warm-up: %d eager step shapes in %.2f s", len(batches),
             time.perf_counter() - started)


def warm_up_batches(config: EngineConfig, model: Model,
                    graph_max_tokens: int) -> list[ForwardBatch]:
    """The eager steps to warm up, on the device: short and long requests filling the token
    budget, the smallest step past the graphs (`graph_max_tokens`) of each kind, the ladder
    of `ladder_shapes` between, and the `mixed_steps`."""
    budget = config.max_num_batched_tokens
    long_query = min(LONG_QUERY, model.max_model_len)
    shapes = []
    for query, rows in ((SHORT_QUERY, config.max_num_seqs), (long_query, budget)):
        largest = min(budget, rows * query)
        for num_tokens in sorted({min(largest, graph_max_tokens + 64), largest}):
            if num_tokens > graph_max_tokens:
                shapes.append((num_tokens, query))
    shapes += [s for s in ladder_shapes(min(budget, config.max_num_seqs * long_query),
                                        long_query, graph_max_tokens) if s not in shapes]
    batches = [padding_requests(num_tokens, query, config.block_size)
               for num_tokens, query in shapes]
    batches += [padding_rows(lens, seq_lens, config.block_size) for lens, seq_lens in
                mixed_steps(budget, config.max_num_seqs, model.max_model_len, graph_max_tokens)]
    groups = kv_groups_of(model)
    for batch in batches:
        batch.group_block_tables = scratch_group_tables(groups, batch.block_tables)
    return [batch.to_device(model.device) for batch in batches]


def ladder_shapes(most: int, query: int, graph_max_tokens: int) -> list[tuple[int, int]]:
    """(tokens, query) steps at each power of two from 2 past the graphs up to `most` tokens,
    and one token short of each in requests one token short of `query`. Triton compiles a
    variant per class of each integer argument (1, a multiple of 16, neither), and a served
    step's token count, request count and lengths are mostly neither; kernels also pick their
    tiles by token count. Without these steps a V4-Flash server's first mixed steps compiled
    17 kernels (`gpu_check.sh dsv4full`'s serve part on 4 x H200: its first 64 requests at
    about half the output rate of the next 64); with the steps from 16 tokens up, 8."""
    shapes, tokens = [], 2
    while tokens <= most:
        if tokens > graph_max_tokens:
            shapes += [(tokens, query), (tokens - 1, max(1, query - 1))]
        tokens *= 2
    return shapes


MIXED_CHUNK = 1024  # a mixed warm-up step's prompt chunk, before its step is rounded
DECODE_CONTEXT = 1100  # a mixed warm-up step's decodes' length: 69 blocks of 16, 275 groups of 4


def mixed_steps(budget: int, max_rows: int, max_model_len: int,
                graph_max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(new tokens, lengths) of each request of steps laid out as a served step is: decodes
    (one new token at DECODE_CONTEXT, or the longest the model takes) beside one prompt chunk,
    for 2^k and 2^k - 1 requests up to `max_rows`, the step's tokens a multiple of 16 or one
    short of it. The request count, the sampled rows' count, the block tables' width and the
    step's length then fall in each class Triton specializes integers by (1, a multiple of
    16, neither); the steps the ladder makes are prompts alone. With these steps too, that
    V4-Flash server compiled no kernel late."""
    context = min(DECODE_CONTEXT, max_model_len)
    base = min(MIXED_CHUNK, max(1, max_model_len // 2))
    counts, rows = set(), 2
    while rows - 1 <= max_rows:
        counts |= {min(rows, max_rows), rows - 1}
        rows *= 2
    steps = []
    for count in sorted(counts):
        decodes = count - 1
        aligned = 16 * -(-(decodes + base) // 16)
        for tokens in (aligned, aligned - 1):
            chunk = min(tokens, budget) - decodes
            if 1 <= chunk <= max_model_len and decodes + chunk > graph_max_tokens:
                steps.append(([1] * decodes + [chunk], [context] * decodes + [chunk]))
    return [s for i, s in enumerate(steps) if s not in steps[:i]]


def padding_requests(num_tokens: int, query: int, block_size: int) -> HostBatch:
    """`num_tokens` tokens as requests of `query` new tokens each (the last shorter), every
    one in the padding block 0, each sampling its last token."""
    lens = [query] * (num_tokens // query)
    if num_tokens % query:
        lens.append(num_tokens % query)
    return padding_rows(lens, lens, block_size)


def padding_rows(lens: list[int], seq_lens: list[int], block_size: int) -> HostBatch:
    """Requests of `lens` new tokens, the last of `seq_lens` tokens each, every token in the
    padding block 0, each sampling its last token."""
    starts = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=starts[1:])
    positions = np.concatenate([np.arange(s - n, s) for n, s in zip(lens, seq_lens,
                                                                    strict=True)])
    positions = positions.astype(np.int64)
    width = -(-max(seq_lens) // block_size)
    return HostBatch(
        input_ids=np.zeros(int(starts[-1]), dtype=np.int64), positions=positions,
        slot_mapping=positions % block_size,  # block 0
        query_start_loc=starts, seq_lens=np.array(seq_lens, dtype=np.int32),
        block_tables=np.zeros((len(lens), width), dtype=np.int32),
        logits_indices=starts[1:].astype(np.int64) - 1,
        max_query_len=max(lens), max_seq_len=max(seq_lens))
