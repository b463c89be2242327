"""Sampling kernels: a device implementation of the sampler's random draw.

Core never imports a kernel package: a model line hands an object of this shape to the engine,
which gives it to `Sampler(..., kernels=...)`. openinfer-kernels provides
`openinfer_kernels.sampling.SAMPLING_KERNELS`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs from Python 3.13


@runtime_checkable
class SamplingKernels(Protocol):
    """Stateless; both methods are pure (they mutate nothing, the inputs included) and may be
    called from any thread."""

    def supports(self, device: torch.device) -> bool:
        """Whether the sampler should use these kernels for logits on `device`."""
        ...

    def race_sample(self, logits: torch.Tensor, temperature: torch.Tensor,
                    min_p: torch.Tensor | None, seeds: torch.Tensor) -> torch.Tensor:
        """One token id per row, [B] int64 on the logits' device, from logits [B, V] (fp32, or
        any float dtype read as fp32) and per-row tensors on the same device:

        temperature [B] fp32: a row with temperature <= 0 is greedy (argmax, lowest id on ties);
        otherwise the id is drawn from softmax(x / T), x the row's logits, by an exponential
        race argmax_v (x_v / T - log E_v), E_v ~ Exp(1) i.i.d. per token.
        min_p [B] fp32 or None (no row filters): a sampled row keeps only ids with
        x_v / T >= max(x / T) + log(min_p); 0 keeps all. A -inf logit is never chosen unless the
        whole row is -inf (then id 0).
        seeds [B] int64: E_v is a function of (seeds[row], v) alone, so a row's draw does not
        depend on its batch. Different devices may map a seed to different noise (same law).

        Launches device work only: no host synchronisation, no device RNG state."""
        ...


# Optional kernels beside `race_sample`: a `SamplingKernels` object may implement any of these;
# the sampler checks with the `supports_*` helpers and otherwise takes the path each names.
@runtime_checkable
class SupportsTopPSample(Protocol):
    """Without it, top_p rows are filtered by a sort on the device before `race_sample`."""

    def top_p_sample(self, logits: torch.Tensor, top_p: torch.Tensor,
                     seeds: torch.Tensor) -> torch.Tensor:
        """One token id per row, [B] int64: `race_sample` at temperature 1 and no min_p over
        logits [B, V] fp32 (already divided by the temperature, min_p applied) with every id
        outside its row's top_p nucleus ([B] fp32 in (0, 1)) at -inf: the smallest prefix, in
        stable descending order, whose probability reaches top_p. The same seeds give the
        token `race_sample` gives on the row so filtered. Device work only."""
        ...


def supports_top_p_sample(kernels: object) -> TypeIs[SupportsTopPSample]:
    return isinstance(kernels, SupportsTopPSample)


@runtime_checkable
class SupportsTopKTopPSample(Protocol):
    """Without it, unseeded top_k / top_p rows are filtered like seeded ones."""

    def top_k_top_p_sample(self, logits: torch.Tensor, top_k: torch.Tensor,
                           top_p: torch.Tensor, seed: int) -> torch.Tensor:
        """One token id per row, [B] int64, drawn from softmax(logits) (fp32 [B, V], divided
        by the temperature) kept to each row's top_k ([B] int32, V: all) largest ids, then
        to the top_p ([B] fp32, 1: all) nucleus of those, with noise from `seed` (a fresh
        one from the sampler's stream each call) that may depend on a row's place in the
        batch: the Sampler sends only rows without a seed, min_p or banned ids. Device work
        only."""
        ...


def supports_top_k_top_p_sample(kernels: object) -> TypeIs[SupportsTopKTopPSample]:
    return isinstance(kernels, SupportsTopKTopPSample)


@runtime_checkable
class SupportsWarmUp(Protocol):
    """Kernels with a first-use cost (a JIT build) that the engine pays at start instead."""

    def warm_up(self, device: torch.device, vocab_size: int) -> None:
        """Build or load now what the first call would. The engine calls it at start."""
        ...


def supports_warm_up(kernels: object) -> TypeIs[SupportsWarmUp]:
    return isinstance(kernels, SupportsWarmUp)
