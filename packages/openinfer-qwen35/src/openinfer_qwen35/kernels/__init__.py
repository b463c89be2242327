"""Qwen3.5's own ops (one folder each, a plain-torch reference beside the GPU path): the
short causal convolution with a carried window and the gated delta rule."""
