"""The depthwise causal convolution of a Gated DeltaNet layer over a mixed batch, each row
continuing its request's window: `causal_conv1d_ref` (plain torch, the CPU path and the
oracle), `prefill_triton.causal_conv1d_triton` (any rows, the GPU's prompt and mixed steps)
and `decode_triton.causal_conv1d_decode` (one token per row, the GPU's decode steps)."""

from __future__ import annotations

import torch

from openinfer_qwen35.kernels.short_conv.reference import causal_conv1d_ref


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                  slots: torch.Tensor, query_start_loc: torch.Tensor, fresh: torch.Tensor,
                  max_query_len: int) -> torch.Tensor:
    """`causal_conv1d_ref`'s results; the Triton kernel on CUDA (`max_query_len`: the
    step's longest row, which sizes its grid)."""
    if x.is_cuda:
        from openinfer_qwen35.kernels.short_conv.prefill_triton import causal_conv1d_triton

        return causal_conv1d_triton(x, weight, conv_state, slots, query_start_loc, fresh,
                                    max_query_len)
    return causal_conv1d_ref(x, weight, conv_state, slots, query_start_loc, fresh)


__all__ = ["causal_conv1d", "causal_conv1d_ref"]
