# mypy: disable-error-code="no-untyped-def"
"""The short convolution for decode steps (one token per row), in one Triton kernel that reads
and writes each row's conv window in its state slot in place: fla's `causal_conv1d_update`
takes a dense [N, D, W] cache with no slot indirection, which would cost a gather and a
scatter per layer around it.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_CHANNELS = 256


@triton.jit
def _conv_decode_kernel(x_ptr, x_row_stride, w_ptr, state_ptr, slots_ptr, fresh_ptr, out_ptr,
                        channels, HIST: tl.constexpr, BLOCK_HIST: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < channels
    h = tl.arange(0, BLOCK_HIST)
    h_ok = h < HIST
    slot = tl.load(slots_ptr + row).to(tl.int64)
    keep = tl.load(fresh_ptr + row).to(tl.int32) == 0
    window_ptr = state_ptr + slot * channels * HIST + c[:, None] * HIST
    ok = c_ok[:, None] & h_ok[None, :]
    window = tl.load(window_ptr + h[None, :], mask=ok, other=0.0)
    # The window after this token: the older inputs moved down one, the token last.
    later = tl.load(window_ptr + h[None, :] + 1, mask=ok & (h[None, :] + 1 < HIST), other=0.0)
    window = tl.where(keep, window, 0.0)
    later = tl.where(keep, later, 0.0)
    x = tl.load(x_ptr + row * x_row_stride + c, mask=c_ok, other=0.0)
    taps = tl.load(w_ptr + c[:, None] * (HIST + 1) + h[None, :],
                   mask=c_ok[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
    last_tap = tl.load(w_ptr + c * (HIST + 1) + HIST, mask=c_ok, other=0.0).to(tl.float32)
    acc = tl.sum(window.to(tl.float32) * taps, axis=1) + x.to(tl.float32) * last_tap
    y = acc * tl.sigmoid(acc)
    tl.store(out_ptr + row * channels + c, y.to(out_ptr.dtype.element_ty), mask=c_ok)
    shifted = tl.where(h[None, :] == HIST - 1, x[:, None].to(window.dtype), later)
    tl.store(window_ptr + h[None, :], shifted, mask=ok)


def causal_conv1d_decode(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                         slots: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """`causal_conv1d_ref` for a step of one token per row: x [B, C] (rows may be strided),
    weight [C, K], conv_state [slots, C, K - 1] (updated in place), slots [B], fresh [B]
    (bool: the row reads zeros). Returns silu(conv) [B, C] in x's dtype."""
    rows, channels = x.shape
    hist = weight.shape[1] - 1
    if x.stride(1) != 1 or not weight.is_contiguous() or not conv_state.is_contiguous():
        raise ValueError("causal_conv1d_decode: x needs unit channel stride, the weight and "
                         "the state contiguous")
    out = torch.empty(rows, channels, dtype=x.dtype, device=x.device)
    grid = (rows, triton.cdiv(channels, BLOCK_CHANNELS))
    _conv_decode_kernel[grid](x, x.stride(0), weight, conv_state, slots, fresh, out, channels,
                              HIST=hist, BLOCK_HIST=triton.next_power_of_2(max(hist, 1)),
                              BLOCK_C=BLOCK_CHANNELS)
    return out
