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
    starts = torch.arange(windows, device=kv.device) * ratio
    return _entries(kv, gate, norm_weight, norm_eps, starts, freqs)


def _entries(kv: torch.Tensor, gate: torch.Tensor, norm_weight: torch.Tensor,
             norm_eps: float, starts: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """[windows, slots, d] projections pooled over their slots by the softmax of the gates
    (per channel, fp32, then kv's dtype), RMS-normalised, each entry rotated at its window's
    first position `starts`."""
    pooled = (kv * torch.softmax(gate.float(), dim=1).to(kv.dtype)).sum(dim=1).float()
    normed = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + norm_eps)
    return rotary_interleaved_ref((norm_weight.float() * normed).to(kv.dtype), starts, freqs)


def compressor_state(ratio: int, width: int, *, device: torch.device | str = "cpu"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's empty compressor state: (kv, gate) rows [2 * ratio, width] fp32, the
    previous window's tokens then the open one's; gates start at -inf (an empty slot weighs
    nothing)."""
    return (torch.zeros(2 * ratio, width, device=device),
            torch.full((2 * ratio, width), float("-inf"), device=device))


def compress_chunk_ref(kv: torch.Tensor, gate: torch.Tensor, start: int,
                       state: tuple[torch.Tensor, torch.Tensor], position_bias: torch.Tensor,
                       norm_weight: torch.Tensor, freqs: torch.Tensor, *, ratio: int,
                       overlap: bool, norm_eps: float) -> torch.Tensor:
    """`compress_kv_ref` a chunk at a time: the projections of tokens start..start+n-1 ([n,
    c*d] each) enter the sequence's `state` (from `compressor_state`, updated in place), and
    each window they close gives its entry: [closed windows, d] in kv's dtype. Any split of a
    sequence into chunks gives the entries of the whole."""
    state_kv, state_gate = state
    width = kv.shape[1] // (2 if overlap else 1)
    closed = []
    for i in range(kv.shape[0]):
        pos = start + i
        slot = ratio + pos % ratio
        state_kv[slot] = kv[i].float()
        state_gate[slot] = gate[i].float() + position_bias[pos % ratio].float()
        if (pos + 1) % ratio:
            continue
        if overlap:  # the previous window's first halves beside this one's second halves
            pool_kv = torch.cat([state_kv[:ratio, :width], state_kv[ratio:, width:]])
            pool_gate = torch.cat([state_gate[:ratio, :width], state_gate[ratio:, width:]])
        else:
            pool_kv, pool_gate = state_kv[ratio:], state_gate[ratio:]
        closed.append(_entries(pool_kv[None].to(kv.dtype), pool_gate[None], norm_weight,
                               norm_eps, torch.tensor([pos + 1 - ratio]), freqs))
        state_kv[:ratio], state_gate[:ratio] = state_kv[ratio:], state_gate[ratio:]
    if not closed:
        return kv.new_zeros(0, width)
    return torch.cat(closed)
