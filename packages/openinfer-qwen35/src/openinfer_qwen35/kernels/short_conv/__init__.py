"""The depthwise causal convolution of a Gated DeltaNet layer over a mixed batch, each row
continuing its request's window (`causal_conv1d_ref`: plain torch, also the GPU path)."""

from openinfer_qwen35.kernels.short_conv.reference import causal_conv1d_ref

causal_conv1d = causal_conv1d_ref

__all__ = ["causal_conv1d", "causal_conv1d_ref"]
