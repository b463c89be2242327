"""FlashInfer's fused top-k / top-p sampling, for the rows it may take (`pip install
openinfer-kernels[flashinfer]`).

FlashInfer draws by rejection sampling over the row (no sort, no filtered copy): at 512 rows of
Qwen3's vocabulary with Qwen3's recommended top_k 20 / top_p 0.95 the Sampler on it takes 3.0 ms
a step on the H100 against 5.2 ms on openinfer's exact select + race (`python -m
benchmarks.ops.run --ops sampling`). Its noise comes from one generator per call and depends on a
row's place in the batch, so it takes only rows without a seed: a seeded row keeps openinfer's
race, whose draw depends on nothing but its seed. It implements core's
`interfaces.sampling.SupportsTopKTopPSample`."""

from __future__ import annotations

from typing import Any

import torch

from openinfer_kernels.sampling import TritonSamplingKernels


class FlashInferSamplingKernels(TritonSamplingKernels):
    """The Triton race for every row, and FlashInfer's top-k / top-p draw for unseeded ones."""

    def __init__(self) -> None:
        self._sampling: Any = None  # flashinfer.sampling, imported at first use (warm_up)
        self._generators: dict[torch.device, torch.Generator] = {}

    def top_k_top_p_sample(self, logits: torch.Tensor, top_k: torch.Tensor,
                           top_p: torch.Tensor, seed: int) -> torch.Tensor:
        """One id per row, [B] int64, from softmax(logits) (fp32 [B, V], already divided by
        the temperature) kept to each row's top_k ([B] int32, V for none) largest ids, then to
        the top_p ([B] fp32, 1 for none) nucleus of those; the noise from a generator seeded
        with `seed` (the sampler's own stream). Device work only."""
        if self._sampling is None:
            try:
                from flashinfer import sampling
            except ImportError as exc:
                raise ImportError("OPENINFER_SAMPLING=flashinfer needs flashinfer-python: "
                                  "pip install 'openinfer-kernels[flashinfer]'") from exc
            self._sampling = sampling
        generator = self._generators.get(logits.device)
        if generator is None:
            generator = self._generators[logits.device] = torch.Generator(logits.device)
        generator.manual_seed(seed)
        ids = self._sampling.top_k_top_p_sampling_from_logits(
            logits.contiguous(), top_k, top_p, filter_apply_order="top_k_first",
            deterministic=True, generator=generator)
        return ids.long()

    def warm_up(self, device: torch.device, vocab_size: int) -> None:
        """Build or load FlashInfer's sampling module now (its first use JIT-compiles it, which
        takes minutes with a cold cache), not in the first step that samples; and the Triton
        kernels' variants."""
        super().warm_up(device, vocab_size)
        logits = torch.zeros(1, vocab_size, device=device)
        self.top_k_top_p_sample(logits, torch.full((1,), 2, dtype=torch.int32, device=device),
                                torch.full((1,), 0.5, device=device), seed=0)
