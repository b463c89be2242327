"""Manifold-constrained hyper-connections (DeepSeek-V4's residual). `hc_pre` and `hc_post` are
one sublayer's step on either side of the sublayer (`hc_pre_ref`, `hc_post_ref`), `hc_head` the
final collapse: Triton kernels on CUDA tensors, the references on CPU. The piecewise references
(`hc_weights_ref`, `hc_collapse_ref`, `hc_expand_ref`) are the model reference's vocabulary."""

from openinfer_deepseek_v4.kernels.mhc.reference import (
    hc_collapse_ref,
    hc_expand_ref,
    hc_head_ref,
    hc_post_ref,
    hc_pre_ref,
    hc_weights_ref,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.mhc.triton")

hc_pre = by_device(hc_pre_ref, _kernels.hc_pre_triton if _kernels else None)
hc_post = by_device(hc_post_ref, _kernels.hc_post_triton if _kernels else None)
hc_head = by_device(hc_head_ref, _kernels.hc_head_triton if _kernels else None)

__all__ = ["hc_collapse_ref", "hc_expand_ref", "hc_head", "hc_head_ref", "hc_post",
           "hc_post_ref", "hc_pre", "hc_pre_ref", "hc_weights_ref"]
