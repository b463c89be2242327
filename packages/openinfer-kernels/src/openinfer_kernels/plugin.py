"""openinfer-kernels' contributions: the attention backends it ships."""

from __future__ import annotations

import importlib.util

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterAttentionBackend


@hookimpl
def openinfer_register_attention_backends(register: RegisterAttentionBackend) -> None:
    register("torch", "openinfer_kernels.attention.backend:TorchAttentionBackend",
             devices=("cpu", "cuda"), priority=0)
    register("triton", "openinfer_kernels.attention.triton_backend:TritonAttentionBackend",
             devices=("cuda",), priority=10)
    if importlib.util.find_spec("flashinfer") is not None:  # the [flashinfer] extra
        register("flashinfer",
                 "openinfer_kernels.attention.flashinfer_backend:FlashInferAttentionBackend",
                 devices=("cuda",), priority=5)
