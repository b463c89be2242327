"""Depthwise causal convolution + SiLU over a flattened batch of rows (prefill chunks and
decode tokens), each row reading its request's last `K - 1` inputs from a state slot and
leaving its own last `K - 1` there. Written as one gather, with no loop over rows and no host
synchronisation, so that it serves the CPU path, the GPU path and CUDA graphs alike."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                      slots: torch.Tensor, query_start_loc: torch.Tensor,
                      fresh: torch.Tensor) -> torch.Tensor:
    """silu(conv(x)) per row, [T, C] in x's dtype.

    x [T, C]: the rows' inputs, row b at `query_start_loc[b]:query_start_loc[b + 1]`. A mixed
    CUDA graph's padding (rows with no tokens, tokens past `query_start_loc[-1]`) changes no
    slot but the padding rows' own (slot 0): a token past the end is convolved as if its
    last row went on, and its output is never read.
    weight [C, K]: one filter per channel, tap K - 1 on the current token.
    conv_state [slots, C, K - 1]: each request's last K - 1 inputs, oldest first; row b reads
    slot `slots[b]` (zeros where `fresh[b]`: a request starting at position 0) and writes its
    own last K - 1 inputs there. Mutates `conv_state`."""
    t, c = x.shape
    k = weight.shape[1]
    hist = k - 1
    rows = slots.shape[0]
    starts = query_start_loc[:-1].long()
    lens = query_start_loc[1:].long() - starts
    # Each token's row, with no host synchronisation; tokens past the step's: the last row.
    row = torch.searchsorted(query_start_loc[1:].long(), torch.arange(t, device=x.device),
                             right=True).clamp(max=rows - 1)
    offset = torch.arange(t, device=x.device) - starts[row]
    kept = conv_state[slots.long()] * (~fresh).to(conv_state.dtype)[:, None, None]
    # One source of inputs: every row's carried window, then the step's tokens.
    source = torch.cat([kept.transpose(1, 2).reshape(rows * hist, c).to(x.dtype), x])

    def index(rows_of: torch.Tensor, row_start: torch.Tensor,
              taps: torch.Tensor) -> torch.Tensor:
        """Where input `taps` (offsets in its row; negative: the carried window) lives in
        `source`."""
        carried = rows_of[:, None] * hist + hist + taps
        return torch.where(taps >= 0, rows * hist + row_start[:, None] + taps, carried)

    taps = offset[:, None] + torch.arange(k, device=x.device) - hist  # [T, K]
    windows = source[index(row, starts[row], taps)]  # [T, K, C]
    out = F.silu((windows.float() * weight.t().float()).sum(dim=1))
    if hist:
        last = lens[:, None] + torch.arange(hist, device=x.device) - hist  # [B, K - 1]
        tail = source[index(torch.arange(rows, device=x.device), starts, last)]
        conv_state[slots.long()] = tail.transpose(1, 2).to(conv_state.dtype)
    return out.to(x.dtype)
