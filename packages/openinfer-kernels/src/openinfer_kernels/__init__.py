"""openinfer-kernels: device ops, each a Triton kernel beside its plain-torch reference."""
