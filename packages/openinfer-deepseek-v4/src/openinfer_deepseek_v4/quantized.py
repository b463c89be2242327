"""DeepSeek-V4's weights kept in their checkpoint formats on the device (spec: shared
deepseek-v4.md §10.1): FP8 e4m3 linears with a power-of-two scale per 128 x 128 block, FP4
e2m1 routed experts with one per 32 inputs. The ops take either a plain tensor (the reference
path, weights dequantized at load) or these, and compute `x @ W^T` with the weight dequantized
in the kernel, so the activations stay in the model's dtype: the numbers of transformers'
forward over the dequantized checkpoint, at a quarter (FP4) or half (FP8) of the bytes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openinfer_deepseek_v4.kernels.moe import dequant_fp4_ref, moe_experts_ref
from openinfer_kernels.fp8_linear import dequant_fp8_blocks_ref
from openinfer_kernels.gemm import grouped_linear_ref
from openinfer_kernels.gemm import linear as dense_linear
from openinfer_kernels.side_stream import wait_for

BLOCK = 128  # FP8 scale block, both dims
GROUP = 32  # FP4 scale group along the input


@dataclass(frozen=True, slots=True)
class Fp8Linear:
    weight: torch.Tensor  # [O, I] float8_e4m3fn
    scale: torch.Tensor  # [ceil(O/128), ceil(I/128)] E8M0 bytes (uint8)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.weight.shape[0], self.weight.shape[1])

    def dequant(self, dtype: torch.dtype) -> torch.Tensor:
        return dequant_fp8_blocks_ref(self.weight, self.scale, BLOCK, dtype)


@dataclass(frozen=True, slots=True)
class Fp4Experts:
    """Every routed expert of a layer, stacked: gate_up = [w1 | w3] rows, down = w2."""

    gate_up: torch.Tensor  # [E, 2I, H/2] uint8, two e2m1 codes per byte
    gate_up_scale: torch.Tensor  # [E, 2I, H/32] E8M0 bytes
    down: torch.Tensor  # [E, H, I/2]
    down_scale: torch.Tensor  # [E, H, I/32]

    def dequant_gate_up(self, dtype: torch.dtype) -> torch.Tensor:
        return _dequant_experts(self.gate_up, self.gate_up_scale, dtype)

    def dequant_down(self, dtype: torch.dtype) -> torch.Tensor:
        return _dequant_experts(self.down, self.down_scale, dtype)


def _dequant_experts(packed: torch.Tensor, scale: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([dequant_fp4_ref(w, s, GROUP, dtype)
                        for w, s in zip(packed, scale, strict=True)])


Weight = torch.Tensor | Fp8Linear


def linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """x [T, I] @ W^T -> [T, O] in x's dtype. A plain weight goes through openinfer-kernels'
    `linear`: the small-batch Triton kernel where its tile table has the shape (one launch
    where cuBLAS's split-K takes two), else `F.linear`, the same product as `x @ W^T`."""
    if isinstance(w, Fp8Linear):
        from openinfer_kernels.fp8_linear import fp8_block_linear

        return fp8_block_linear(x, w.weight, w.scale)
    return dense_linear(x, w) if x.dim() == 2 else x @ w.t()


def swiglu_linear(x: torch.Tensor, w: Weight, limit: float) -> torch.Tensor:
    """`swiglu_clamped(linear(x, w), limit)` for a [gate; up] weight w [2I, I']: x [T, I'] ->
    [T, I]. FP8: the product and the clamped activation in one launch (the gated epilogue of
    `fp8_block_linear_silu_mul`, the same roundings)."""
    if isinstance(w, Fp8Linear):
        from openinfer_kernels.fp8_linear import fp8_block_linear_silu_mul

        return fp8_block_linear_silu_mul(x, w.weight, w.scale, limit=limit)
    from openinfer_deepseek_v4.kernels.swiglu import swiglu_clamped

    return swiglu_clamped(linear(x, w), limit)


def grouped_linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """The block-diagonal output projection: x [T, G, K], W [G * R, K] -> [T, G, R] (group g's
    rows g*R.. times its own inputs). With FP8 each group is a linear of its own rows and scales
    (R is a multiple of the scale block in every released config), all in one launch on the
    GPU (`fp8_grouped_linear`)."""
    if not isinstance(w, Fp8Linear):
        return grouped_linear_ref(x, w)
    if w.weight.shape[0] // x.shape[1] % BLOCK:  # groups share scale blocks (tiny test models)
        return grouped_linear_ref(x, w.dequant(x.dtype))
    from openinfer_kernels.fp8_linear import fp8_grouped_linear

    return fp8_grouped_linear(x, w.weight, w.scale)


def routed_experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                   gate_up: torch.Tensor | Fp4Experts, down: torch.Tensor | None,
                   limit: float, add: torch.Tensor | None = None,
                   settled: bool = False,
                   add_ready: torch.cuda.Event | None = None) -> torch.Tensor:
    """sum over token t's experts of weights[t, e] * down_e(swiglu(gate_up_e x_t)): x [T, H],
    ids/weights [T, k] -> [T, H]; plus `add` [T, H] where given (the shared expert's output:
    the FP4 experts' decode kernel adds it before its rounding, saving a launch), waited for
    through `add_ready` where a side stream writes it (`side_stream.beside`). `settled`:
    x, ids and weights were written two or more kernels before this call's first (its kernels
    may then read them before their PDL wait)."""
    if isinstance(gate_up, Fp4Experts):
        from openinfer_deepseek_v4.kernels.moe import fp4_moe_experts

        return fp4_moe_experts(x, ids, weights, gate_up.gate_up, gate_up.gate_up_scale,
                               gate_up.down, gate_up.down_scale, limit, add=add,
                               settled=settled, add_ready=add_ready)
    assert down is not None
    out = moe_experts_ref(x, ids, weights, gate_up, down, limit)
    wait_for(add_ready)
    return out if add is None else out + add
