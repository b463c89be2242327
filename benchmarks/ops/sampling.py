"""What sampling costs a step, by batch size and sampling parameters: the engine's `Sampler`
with openinfer-kernels' `SAMPLING_KERNELS` (OPENINFER_SAMPLING picks them), FlashInfer's own
calls alone where flashinfer-python is installed, and `torch.topk` as a point of reference.
Logits are random fp32 rows of Qwen3's vocabulary. The draws are random: no reference."""

from __future__ import annotations

import os
from typing import Any

import torch

from benchmarks.ops.registry import Case, Impl, Work, register_op

VOCAB = 151936
MODES: dict[str, dict[str, Any]] = {  # Qwen3's generation_config.json is "qwen3-default"
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.7),
    "qwen3-default": dict(temperature=0.6, top_k=20, top_p=0.95),
    "top-p-0.9": dict(temperature=1.0, top_p=0.9),
    "top-k-50": dict(temperature=1.0, top_k=50),
    "greedy+5-logprobs": dict(temperature=0.0, logprobs=5),
}
# The modes FlashInfer's standalone calls cover.
FLASHINFER_MODES = {"qwen3-default", "top-p-0.9"}
Inputs = tuple[torch.Tensor, str]  # logits [B, V], mode


def _sampler_impl(a: Inputs) -> Any:
    from openinfer_core.params import SamplingParams
    from openinfer_core.sampling.sampler import Sampler, SamplingRow
    from openinfer_kernels.sampling import SAMPLING_KERNELS

    logits, mode = a
    sampler = Sampler(VOCAB, seed=0, kernels=SAMPLING_KERNELS)
    rows = [SamplingRow(SamplingParams(max_tokens=16, **MODES[mode]), (1, 2, 3), (4,))
            for _ in range(logits.shape[0])]
    return lambda: sampler.sample(logits, rows)


def _flashinfer_impl(a: Inputs) -> Any:
    logits, mode = a
    if mode not in FLASHINFER_MODES or os.environ.get("OPENINFER_SAMPLING") == "flashinfer":
        return None  # the sampler already runs FlashInfer's calls
    try:
        import flashinfer.sampling as fi
    except ImportError:
        return None
    batch = logits.shape[0]
    if mode == "top-p-0.9":
        return lambda: fi.top_p_sampling_from_probs(torch.softmax(logits, -1), 0.9).cpu()
    k = torch.full((batch,), 20, dtype=torch.int32, device=logits.device)
    p = torch.full((batch,), 0.95, device=logits.device)
    return lambda: fi.top_k_top_p_sampling_from_logits(logits / 0.6, k, p).cpu()


def _topk_impl(a: Inputs) -> Any:
    logits, mode = a
    if mode != "greedy":  # one reference point a batch is enough
        return None
    return lambda: torch.topk(logits, 20, dim=-1).indices.cpu()


IMPLS: dict[str, Impl] = {"sampler": _sampler_impl, "flashinfer": _flashinfer_impl,
                          "torch.topk-20": _topk_impl}

register_op(
    "sampling",
    doc="sampling a step's ids to the host, us per step by batch and mode (host wall time: "
        "the sampler waits on the device itself)",
    cases=[Case(f"{mode}-B{b}", {"batch": b, "mode": mode})
           for b in (1, 64, 256, 512) for mode in MODES],
    build=lambda c: [(torch.randn(c.params["batch"], VOCAB, device="cuda") * 4,
                      c.params["mode"])],
    impls=IMPLS,
    work=lambda c: Work(0.0, 4 * c.params["batch"] * VOCAB),
    timing="wall",
)
