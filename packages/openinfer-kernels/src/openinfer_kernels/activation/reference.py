"""The gated MLP activation."""

from __future__ import annotations

import torch


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up] ([T, 2I]) -> silu(gate) * up ([T, I])."""
    gate, up = x.float().chunk(2, dim=-1)
    # silu is rounded to x's dtype before the product (transformers' order).
    return (torch.nn.functional.silu(gate).to(x.dtype).float() * up).to(x.dtype)
