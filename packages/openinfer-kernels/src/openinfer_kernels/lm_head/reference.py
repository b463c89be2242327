"""The vocabulary projection: next-token logits in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lm_head_logits_ref(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`hidden` [S, H] against `weight` [V, H]: logits [S, V] in fp32, computed in the weights'
    dtype (so bf16 logits are rounded to bf16 first)."""
    return F.linear(hidden, weight).float()
