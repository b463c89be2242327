"""The vocabulary projection: next-token logits in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lm_head_logits_ref(hidden: torch.Tensor, weight: torch.Tensor,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """`hidden` [S, H] against `weight` [V, H]: logits [S, V] in fp32, computed in the weights'
    dtype (so bf16 logits are rounded to bf16 first); into `out` ([S, V] fp32) when given."""
    logits = F.linear(hidden, weight).float()
    return logits if out is None else out.copy_(logits)
