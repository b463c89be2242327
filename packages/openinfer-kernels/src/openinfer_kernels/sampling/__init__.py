"""Sampling on the device: `race_sample`, and `SAMPLING_KERNELS`, the object that implements
core's `openinfer_core.interfaces.sampling.SamplingKernels` for the Sampler."""

from __future__ import annotations

import importlib.util
import os

import torch

from openinfer_kernels.dispatch import by_device, triton_kernels
from openinfer_kernels.sampling.reference import race_sample_ref, top_p_sample_ref

_kernels = triton_kernels("openinfer_kernels.sampling.triton")
_top_p = triton_kernels("openinfer_kernels.sampling.top_p")

race_sample = by_device(race_sample_ref, _kernels.race_sample_triton if _kernels else None)
top_p_sample = by_device(top_p_sample_ref, _top_p.top_p_sample_triton if _top_p else None)


class TritonSamplingKernels:
    """Core's `SamplingKernels`: the Sampler sends its random rows here for CUDA logits."""

    def supports(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def race_sample(self, logits: torch.Tensor, temperature: torch.Tensor,
                    min_p: torch.Tensor | None, seeds: torch.Tensor) -> torch.Tensor:
        return race_sample(logits, temperature, min_p, seeds)

    def top_p_sample(self, logits: torch.Tensor, top_p: torch.Tensor,
                     seeds: torch.Tensor) -> torch.Tensor:
        return top_p_sample(logits, top_p, seeds)

    def warm_up(self, device: torch.device, vocab_size: int) -> None:
        """Launch each kernel variant the sampler can need (with and without min_p, the top-p
        race) on one row, so none compiles in a step; within start-up's compile-ahead round
        they compile there, in parallel with the model's. The Sampler calls it only for a
        device the kernels support."""
        logits = torch.zeros(1, vocab_size, device=device)
        one = torch.ones(1, device=device)
        seeds = torch.zeros(1, dtype=torch.int64, device=device)
        race_sample(logits, one, None, seeds)
        race_sample(logits, one, one / 2, seeds)
        top_p_sample(logits, one / 2, seeds)


def _sampling_kernels() -> TritonSamplingKernels:
    """OPENINFER_SAMPLING: `flashinfer` (FlashInfer's top-k / top-p draw for unseeded rows),
    `triton`, or unset: flashinfer where flashinfer-python is installed."""
    wanted = os.environ.get("OPENINFER_SAMPLING", "")
    if wanted not in ("", "flashinfer", "triton"):
        raise ValueError(f"OPENINFER_SAMPLING must be 'flashinfer' or 'triton', not {wanted!r}")
    if wanted == "flashinfer" or (not wanted and importlib.util.find_spec("flashinfer")):
        from openinfer_kernels.sampling.flashinfer import FlashInferSamplingKernels

        return FlashInferSamplingKernels()
    return TritonSamplingKernels()


SAMPLING_KERNELS = _sampling_kernels()

__all__ = ["SAMPLING_KERNELS", "TritonSamplingKernels", "race_sample", "race_sample_ref",
           "top_p_sample", "top_p_sample_ref"]
