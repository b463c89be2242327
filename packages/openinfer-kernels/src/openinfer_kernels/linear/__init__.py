"""Small-batch linear layers (issue 13, in progress): the reference and the Triton kernels
with their tiles; not yet wired into the model lines."""

from openinfer_kernels.linear.reference import linear_ref

__all__ = ["linear_ref"]
