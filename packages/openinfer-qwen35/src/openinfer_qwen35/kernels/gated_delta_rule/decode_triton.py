# mypy: disable-error-code="no-untyped-def"
"""The gated delta rule for decode steps (one token per row) in one Triton kernel, fed
straight from the layer's projections: the q/k L2 norms, beta = sigmoid(b) and the decay
g = -exp(A_log) * softplus(a + dt_bias) are taken in the kernel, and each row's state matrix is
read from and written back to its slot in place. fla's `fused_recurrent_gated_delta_rule`
computes the same recurrence but on a dense [N, HV, K, V] state (a gather and a scatter of
every row's state per layer) with the gates made by separate kernels.

One program per (row, value head, block of value columns): it holds a [K, BLOCK_V] slice of
the state in registers, the split fla's kernel uses too.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 8


@triton.jit
def _gdn_decode_kernel(qkv_ptr, qkv_row_stride, a_ptr, b_ptr, ab_row_stride, a_neg_ptr,
                       dt_bias_ptr, state_ptr, slots_ptr, fresh_ptr, out_ptr, scale,
                       KEY_HEADS: tl.constexpr, VALUE_HEADS: tl.constexpr, K: tl.constexpr,
                       V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    row_head = tl.program_id(1)
    row = row_head // VALUE_HEADS
    hv = row_head % VALUE_HEADS
    hk = hv // (VALUE_HEADS // KEY_HEADS)
    ok_k = tl.arange(0, BLOCK_K)
    ov = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok = ok_k < K
    v_ok = ov < V
    base = qkv_ptr + row * qkv_row_stride
    q = tl.load(base + hk * K + ok_k, mask=k_ok, other=0.0).to(tl.float32)
    k = tl.load(base + KEY_HEADS * K + hk * K + ok_k, mask=k_ok, other=0.0).to(tl.float32)
    v = tl.load(base + 2 * KEY_HEADS * K + hv * V + ov, mask=v_ok, other=0.0).to(tl.float32)
    q = q / tl.sqrt(tl.sum(q * q) + 1e-6) * scale
    k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
    # sigmoid(b) rounded to b's dtype, as the layer (and transformers) make it in torch.
    b = tl.load(b_ptr + row * ab_row_stride + hv)
    beta = tl.sigmoid(b.to(tl.float32)).to(b.dtype).to(tl.float32)
    a = tl.load(a_ptr + row * ab_row_stride + hv).to(tl.float32)
    a = a + tl.load(dt_bias_ptr + hv).to(tl.float32)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(a)))  # torch's threshold
    decay = tl.exp(tl.load(a_neg_ptr + hv) * softplus)

    slot = tl.load(slots_ptr + row).to(tl.int64)
    keep = tl.load(fresh_ptr + row).to(tl.int32) == 0
    s_ptr = (state_ptr + (slot * VALUE_HEADS + hv) * K * V + ok_k[:, None] * V + ov[None, :])
    s_ok = k_ok[:, None] & v_ok[None, :]
    s = tl.where(keep, tl.load(s_ptr, mask=s_ok, other=0.0), 0.0) * decay
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s = s + k[:, None] * delta[None, :]
    o = tl.sum(s * q[:, None], axis=0)
    tl.store(out_ptr + (row * VALUE_HEADS + hv) * V + ov, o.to(out_ptr.dtype.element_ty),
             mask=v_ok)
    tl.store(s_ptr, s, mask=s_ok)


def gated_delta_rule_decode(qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                            a_neg: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor,
                            slots: torch.Tensor, fresh: torch.Tensor,
                            key_heads: int) -> torch.Tensor:
    """One decode token per row. qkv [B, 2 * Hk * K + HV * V]: the convolution's output
    (q, k, v heads in that order); a, b [B, HV]: the raw gate projections (rows may be
    strided, sharing one row stride); a_neg [HV] fp32 (-exp(A_log)); dt_bias [HV]; state
    [slots, HV, K, V] fp32, updated in place at each row's slot (zeros read where `fresh`).
    Returns the outputs [B, HV, V] in qkv's dtype: `gated_delta_rule_varlen_ref`'s, with
    beta and g made from a and b as the layer makes them."""
    rows = qkv.shape[0]
    _, value_heads, k_dim, v_dim = state.shape
    if (qkv.stride(1) != 1 or a.stride(1) != 1 or b.stride(1) != 1
            or a.stride(0) != b.stride(0) or not state.is_contiguous()):
        raise ValueError("gated_delta_rule_decode: unit column strides, a and b on one row "
                         "stride, and a contiguous state expected")
    out = torch.empty(rows, value_heads, v_dim, dtype=qkv.dtype, device=qkv.device)
    grid = (triton.cdiv(v_dim, BLOCK_V), rows * value_heads)
    _gdn_decode_kernel[grid](qkv, qkv.stride(0), a, b, a.stride(0), a_neg, dt_bias, state,
                             slots, fresh, out, k_dim ** -0.5, KEY_HEADS=key_heads,
                             VALUE_HEADS=value_heads, K=k_dim, V=v_dim,
                             BLOCK_K=triton.next_power_of_2(k_dim), BLOCK_V=BLOCK_V,
                             num_warps=1)
    return out
