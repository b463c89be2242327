"""Manifold-constrained hyper-connections (DeepSeek-V4's residual). `hc_pre` and `hc_post` are
one sublayer's step on either side of the sublayer (`hc_pre_ref`, `hc_post_ref`), `hc_head` the
final collapse: Triton kernels on CUDA tensors, the references on CPU. `hc_post_all_reduce`:
`hc_post` of a tensor-parallel sublayer's partial output, summed over the ranks in the same
launch where the group's push memory takes the rows (`push_post.py`);
`hc_post_pre_all_reduce` does that and the next sublayer's `hc_pre` in one launch, for one
token (`push_post_pre.py`). hc_pre hands hc_post comb's logits: comb's Sinkhorn-Knopp
(`comb_ref`) runs in hc_post. The piecewise references (`hc_weights_ref`, `hc_collapse_ref`,
`hc_expand_ref`) are the model reference's vocabulary."""

from __future__ import annotations

import torch

from openinfer_core.interfaces.model import PushAreas
from openinfer_deepseek_v4.kernels.mhc.reference import (
    comb_ref,
    hc_collapse_ref,
    hc_expand_ref,
    hc_head_ref,
    hc_post_ref,
    hc_pre_ref,
    hc_weights_ref,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.mhc.triton")
_push = triton_kernels("openinfer_deepseek_v4.kernels.mhc.push_post")
_post_pre = triton_kernels("openinfer_deepseek_v4.kernels.mhc.push_post_pre")

hc_pre = by_device(hc_pre_ref, _kernels.hc_pre_triton if _kernels else None)
hc_post = by_device(hc_post_ref, _kernels.hc_post_triton if _kernels else None)
hc_head = by_device(hc_head_ref, _kernels.hc_head_triton if _kernels else None)



def hc_post_all_reduce(streams: torch.Tensor, partial: torch.Tensor, post: torch.Tensor,
                       comb_logits: torch.Tensor, push: PushAreas | None, *, hc_eps: float,
                       sinkhorn_iters: int) -> torch.Tensor | None:
    """`hc_post(streams, the sum of partial over the ranks, post, comb_logits, ...)` in one
    launch where `push` (the group's push memory, `TensorParallelGroup.push_areas`) takes
    these rows: on CUDA, the rows their own signal, at most its rows; None, nothing done,
    elsewhere (then the group's `all_reduce` and `hc_post`). The same answer on every rank for
    the same shapes."""
    if (_push is None or push is None or not partial.is_cuda
            or push.area_fill != _push.EMPTY_BYTE or not 0 < partial.shape[0] <= push.max_rows):
        return None
    return _push.hc_post_all_reduce_triton(streams, partial, post, comb_logits, push.areas,
                                           push.seqs, push.rank, hc_eps=hc_eps,
                                           sinkhorn_iters=sinkhorn_iters)


def hc_post_pre_all_reduce(streams: torch.Tensor, partial: torch.Tensor, post: torch.Tensor,
                           comb_logits: torch.Tensor, push: PushAreas | None, fn: torch.Tensor,
                           base: torch.Tensor, scale: torch.Tensor, norm_weight: torch.Tensor,
                           *, hc_eps: float, sinkhorn_iters: int, norm_eps: float
                           ) -> tuple[torch.Tensor, ...] | None:
    """`hc_post_all_reduce` and then the next sublayer's `hc_pre` (fn, base, scale,
    norm_weight) of its new streams, in one launch (`push_post_pre.py`): (new streams, x,
    post, comb's logits) for a step of one token on CUDA where `push` takes the row; None,
    nothing done, elsewhere."""
    if (_post_pre is None or push is None or not partial.is_cuda
            or push.area_fill != _post_pre.EMPTY_BYTE or partial.shape[0] != 1):
        return None
    return _post_pre.hc_post_pre_all_reduce_triton(
        streams, partial, post, comb_logits, push.areas, push.seqs, push.rank, fn, base, scale,
        norm_weight, hc_eps=hc_eps, sinkhorn_iters=sinkhorn_iters, norm_eps=norm_eps)


__all__ = ["comb_ref", "hc_collapse_ref", "hc_expand_ref", "hc_head", "hc_head_ref", "hc_post",
           "hc_post_all_reduce", "hc_post_pre_all_reduce", "hc_post_ref", "hc_pre", "hc_pre_ref",
           "hc_weights_ref"]
