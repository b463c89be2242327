"""Set up before any test directory is collected (pytest loads this file first)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Without a GPU, the kernel tests run the Triton kernels on CPU tensors under the Triton
    # interpreter. Triton reads this switch when it is imported (each @triton.jit, its own
    # library's included, picks interpreter or compiler then), and collecting the root tests
    # already imports the kernel modules: so it is set here, not in the kernels' own conftest.
    os.environ.setdefault("TRITON_INTERPRET", "1")
