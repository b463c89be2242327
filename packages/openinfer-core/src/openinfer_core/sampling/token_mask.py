"""Grammar bitmasks on the device: bit j of word w allows token 32 * w + j."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class TokenMask:
    """Which tokens some rows of a step may sample: `rows` [k] int64 (sampling-row indices)
    and `bits` [k, ceil(V / 32)] int32, both on the logits' device."""

    rows: torch.Tensor
    bits: torch.Tensor


def apply_token_mask(logits: torch.Tensor, mask: TokenMask) -> None:
    """Set the disallowed tokens of the masked rows to -inf, in place. A row that would allow
    nothing is left as it is (a grammar in an error state must not make sampling pick from
    all -inf)."""
    vocab = logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((mask.bits.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab].bool()
    allowed |= ~allowed.any(dim=-1, keepdim=True)
    rows = logits.index_select(0, mask.rows)
    logits.index_copy_(0, mask.rows, rows.masked_fill_(~allowed, float("-inf")))
