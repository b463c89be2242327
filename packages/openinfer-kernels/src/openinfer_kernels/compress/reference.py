"""DeepSeek-V4's KV compressor (spec: shared deepseek-v4.md §5.5): every `ratio` tokens of a
sequence become one compressed KV entry, a softmax-gated sum of their projections, taken per
channel over the window's tokens, then RMS-normalised and rotated at the window's first
position. With `overlap` (the ratio-4 layers) each token projects to two halves: entry j pools
the first halves of window j-1's tokens beside the second halves of window j's (eight slots at
ratio 4; window -1 is empty).

This is the whole-sequence form: the entries of a prefix from its projections. (The serving
path keeps the open window's projections per sequence and emits an entry when it closes.)"""

from __future__ import annotations

import torch

from openinfer_kernels.rotary.interleaved import rotary_interleaved_ref


def compress_kv_ref(kv: torch.Tensor, gate: torch.Tensor, position_bias: torch.Tensor,
                    norm_weight: torch.Tensor, freqs: torch.Tensor, *, ratio: int,
                    overlap: bool, norm_eps: float) -> torch.Tensor:
    """kv, gate [T, c*d] (x W_kv^T, x W_gate^T; c = 2 with `overlap`, else 1), position_bias
    [ratio, c*d] (added to the gate of a window's i-th token), norm_weight [d], freqs the
    compressed layers' rotary frequencies -> [T // ratio, d] in kv's dtype: one entry per
    complete window, a trailing partial window left out."""
    windows = kv.shape[0] // ratio
    width = kv.shape[1] // (2 if overlap else 1)
    if windows == 0:
        return kv.new_zeros(0, width)
    kv = kv[:windows * ratio].view(windows, ratio, kv.shape[1])
    gate = gate[:windows * ratio].view(windows, ratio, gate.shape[1]) + position_bias
    if overlap:
        # slots [0, ratio): the previous window's first halves; [ratio, 2 ratio): this one's
        # second halves. Window 0 has no previous window: zero values, weight 0.
        prev_kv = torch.cat([kv.new_zeros(1, ratio, width), kv[:-1, :, :width]])
        prev_gate = torch.cat([gate.new_full((1, ratio, width), float("-inf")),
                               gate[:-1, :, :width]])
        kv = torch.cat([prev_kv, kv[:, :, width:]], dim=1)
        gate = torch.cat([prev_gate, gate[:, :, width:]], dim=1)
    weights = torch.softmax(gate.float(), dim=1).to(kv.dtype)
    pooled = (kv * weights).sum(dim=1)
    normed = pooled.float() * torch.rsqrt(pooled.float().square().mean(-1, keepdim=True)
                                          + norm_eps)
    entries = (norm_weight.float() * normed).to(kv.dtype)
    starts = torch.arange(windows, device=kv.device) * ratio
    return rotary_interleaved_ref(entries, starts, freqs)
