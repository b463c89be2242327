# mypy: disable-error-code="no-untyped-def"
"""The short convolution over a flattened batch of rows of any length (prompt chunks, decode
tokens), in one Triton kernel: `causal_conv1d_ref`'s contract without its [T, K, C] gather.
Program (row, block of the row's tokens, block of channels) sums the K taps, reading a tap
before the row's first token from the row's conv window in its state slot (zeros where the
row starts afresh). The row's first token block also writes the row's new window (its last
K - 1 inputs, from the old window where the row is shorter than that), after its own reads:
no other program reads the slot, so nothing races.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_TOKENS = 16
BLOCK_CHANNELS = 128


@triton.jit
def _tap_inputs(x_ptr, x_row_stride, window_ptr, start, length, rel, c, c_ok, keep,
                HIST: tl.constexpr):
    """The inputs at row-relative positions `rel` [BT] (negative: the carried window's last
    -rel-th input; `length` or past: zeros, never read, as they may lie past x's end) for
    channels c [BC] -> [BT, BC] fp32."""
    in_row = rel >= 0
    from_x = tl.load(x_ptr + (start + tl.where(in_row, rel, 0))[:, None] * x_row_stride
                     + c[None, :], mask=(in_row & (rel < length))[:, None] & c_ok[None, :],
                     other=0.0)
    back = HIST + tl.where(in_row, -1, rel)
    carried = tl.load(window_ptr + c[None, :] * HIST + back[:, None],
                      mask=(~in_row)[:, None] & c_ok[None, :], other=0.0)
    carried = tl.where(keep, carried.to(tl.float32), 0.0)
    return tl.where(in_row[:, None], from_x.to(tl.float32), carried)


@triton.jit
def _conv_prefill_kernel(x_ptr, x_row_stride, w_ptr, state_ptr, slots_ptr, fresh_ptr, qsl_ptr,
                         out_ptr, channels, HIST: tl.constexpr, BLOCK_HIST: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0)
    block = tl.program_id(1)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < channels
    start = tl.load(qsl_ptr + row).to(tl.int64)
    length = tl.load(qsl_ptr + row + 1).to(tl.int64) - start
    t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    if block * BLOCK_T >= tl.maximum(length, 1):
        return
    slot = tl.load(slots_ptr + row).to(tl.int64)
    keep = tl.load(fresh_ptr + row).to(tl.int32) == 0
    window_ptr = state_ptr + slot * channels * HIST
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(HIST + 1):  # tap j reads the input j - HIST tokens back
        inputs = _tap_inputs(x_ptr, x_row_stride, window_ptr, start, length, t - HIST + j, c,
                             c_ok, keep, HIST)
        tap = tl.load(w_ptr + c * (HIST + 1) + j, mask=c_ok, other=0.0).to(tl.float32)
        acc += inputs * tap[None, :]
    y = acc * tl.sigmoid(acc)
    t_ok = t < length
    tl.store(out_ptr + (start + t)[:, None] * channels + c[None, :],
             y.to(out_ptr.dtype.element_ty), mask=t_ok[:, None] & c_ok[None, :])
    if block == 0:  # the row's new window: its inputs at length - HIST .. length - 1
        h = tl.arange(0, BLOCK_HIST)
        rel = length - HIST + h  # past the row's end where h >= HIST: masked, never stored
        tail = _tap_inputs(x_ptr, x_row_stride, window_ptr, start, length, rel, c, c_ok, keep,
                           HIST)
        tl.debug_barrier()  # every thread's window reads above come before the stores
        tl.store(window_ptr + c[None, :] * HIST + h[:, None],
                 tail.to(state_ptr.dtype.element_ty), mask=(h < HIST)[:, None] & c_ok[None, :])


def causal_conv1d_triton(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                         slots: torch.Tensor, query_start_loc: torch.Tensor,
                         fresh: torch.Tensor, max_query_len: int) -> torch.Tensor:
    """`causal_conv1d_ref`'s results and state updates, `max_query_len` the longest row (a
    host int the step has). Tokens past `query_start_loc[-1]` come out as zeros."""
    tokens, channels = x.shape
    rows = slots.shape[0]
    hist = weight.shape[1] - 1
    if (x.stride(1) != 1 or not weight.is_contiguous() or not conv_state.is_contiguous()
            or not 1 <= hist < BLOCK_TOKENS):
        raise ValueError("causal_conv1d_triton: x needs unit channel stride, the weight and "
                         f"the state contiguous, 2 to {BLOCK_TOKENS} taps")
    out = torch.zeros(tokens, channels, dtype=x.dtype, device=x.device)
    if rows:
        grid = (rows, triton.cdiv(max(max_query_len, 1), BLOCK_TOKENS),
                triton.cdiv(channels, BLOCK_CHANNELS))
        _conv_prefill_kernel[grid](x, x.stride(0), weight, conv_state, slots, fresh,
                                   query_start_loc, out, channels, HIST=hist,
                                   BLOCK_HIST=triton.next_power_of_2(hist),
                                   BLOCK_T=BLOCK_TOKENS, BLOCK_C=BLOCK_CHANNELS)
    return out
