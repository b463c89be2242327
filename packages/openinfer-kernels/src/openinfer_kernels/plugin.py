"""openinfer-kernels' contributions: the attention backends it ships, and the compiler that
compiles its Triton kernels ahead at start-up."""

from __future__ import annotations

import importlib.util

from openinfer_core.hookspecs import hookimpl
from openinfer_core.registry import RegisterAttentionBackend, RegisterKernelCompiler


@hookimpl
def openinfer_register_attention_backends(register: RegisterAttentionBackend) -> None:
    register("torch", "openinfer_kernels.attention.backend:TorchAttentionBackend",
             devices=("cpu", "cuda"), priority=0)
    register("triton", "openinfer_kernels.attention.triton_backend:TritonAttentionBackend",
             devices=("cuda",), priority=10)
    # The [flashinfer] extra. Where installed it is the default on CUDA: it runs the long
    # prompt steps (past the Triton graphs' token limit) on FlashInfer's prefill, which is
    # faster there, and every other step on the Triton kernels from CUDA graphs
    # (flashinfer_backend.py; the measurements are in the package README).
    if importlib.util.find_spec("flashinfer") is not None:
        register("flashinfer",
                 "openinfer_kernels.attention.flashinfer_backend:FlashInferAttentionBackend",
                 devices=("cuda",), priority=20)


@hookimpl
def openinfer_register_kernel_compilers(register: RegisterKernelCompiler) -> None:
    register("triton", "openinfer_kernels.compile_ahead:TritonCompiler",
             sources=("openinfer_kernels",))
