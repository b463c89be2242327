"""Manifold-constrained hyper-connections (DeepSeek-V4's residual): the reference ops. No Triton
kernel yet: they run as written on every device."""

from openinfer_kernels.mhc.reference import (
    hc_collapse_ref,
    hc_expand_ref,
    hc_head_ref,
    hc_weights_ref,
)

__all__ = ["hc_collapse_ref", "hc_expand_ref", "hc_head_ref", "hc_weights_ref"]
