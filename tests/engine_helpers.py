"""Driving the engine directly in tests: all-position logits, greedy random requests, staggered
arrivals (the latter from `openinfer_core.testing`, re-exported here)."""

from __future__ import annotations

import json
import random
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.engine import Engine
from openinfer_core.engine.request_state import RequestState
from openinfer_core.events import Finished, TokenEvent
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
from openinfer_core.testing import run_staggered, tokens_of

__all__ = ["engine_block_bytes", "finished_of", "greedy", "hf_greedy", "prompt_logits",
           "random_requests", "run_staggered", "tokens_of"]


@torch.inference_mode()
def prompt_logits(engine: Engine, token_ids: Sequence[int]) -> torch.Tensor:
    """fp32 logits at every prompt position, from one prefill through the engine's model and
    KV cache (the blocks are freed afterwards)."""
    seq = RequestState.from_request(GenerateRequest("logits-probe", tuple(token_ids)))
    assert engine.kv.allocate(seq.request_id, len(token_ids))
    try:
        host = plan_batch([ScheduledRow(seq, len(token_ids), True)], engine.kv)
        host.logits_indices = np.arange(len(token_ids), dtype=np.int64)
        return engine.model.forward(host.to_device(engine.model.device))
    finally:
        engine.kv.free(seq.request_id)


def greedy(n: int) -> SamplingParams:
    """`n` greedy tokens, past any end-of-sequence token."""
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def random_requests(n: int, seed: int, lengths: tuple[int, int], max_tokens: int,
                    vocab: int) -> list[GenerateRequest]:
    """`n` greedy requests r0.. of `max_tokens` tokens, prompts of random ids below `vocab`
    with lengths drawn from `lengths` (both ends included)."""
    rng = random.Random(seed)
    return [GenerateRequest(f"r{i}", tuple(rng.randrange(vocab)
                                           for _ in range(rng.randint(*lengths))),
                            greedy(max_tokens)) for i in range(n)]


def finished_of(events: Sequence[TokenEvent]) -> Finished:
    last = events[-1]
    assert isinstance(last, Finished), f"expected Finished last, got {last!r}"
    return last


# Keyed weakly by the model itself: an id() can be reused by the next module's model once
# this one is freed, which would hand it another model's tokens.
_Greedy = dict[tuple[tuple[int, ...], int], list[int]]
_greedy_cache: weakref.WeakKeyDictionary[torch.nn.Module, _Greedy] = weakref.WeakKeyDictionary()


@torch.inference_mode()
def hf_greedy(hf_model: torch.nn.Module, token_ids: Sequence[int], n: int) -> list[int]:
    """n greedy tokens from transformers (its own KV cache), memoized per model and prompt."""
    cache = _greedy_cache.setdefault(hf_model, {})
    key = (tuple(token_ids), n)
    if key not in cache:
        out = hf_model(torch.tensor([list(token_ids)]), use_cache=True, logits_to_keep=1)
        tokens = [int(out.logits[0, -1].argmax())]
        for _ in range(n - 1):
            out = hf_model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values,
                           use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
        cache[key] = tokens
    return list(cache[key])


def engine_block_bytes(model_dir: Path, block_size: int = 16) -> int:
    """Bytes of one fp32 KV block of a tiny Qwen3 checkpoint (to size offload pools)."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return (2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
            * block_size)
