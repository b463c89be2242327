"""Without a CUDA device, the kernel tests run the Triton kernels on CPU tensors under the Triton
interpreter; with one, they run compiled at full size (`-m gpu` adds the large cases)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # The workspace's root conftest.py sets this before anything imports triton; this covers a
    # run of this package's tests on their own.
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Every @triton.jit, triton's own tl.cdiv and tl.sum included, chose the compiler when it
        # was imported; launching on CPU tensors would fail test by test, obscurely.
        raise pytest.UsageError(
            "triton was imported before TRITON_INTERPRET=1 was set, so the kernel tests cannot "
            "run under the interpreter: set TRITON_INTERPRET=1 in the environment, or set it in "
            "a conftest.py that pytest loads before the tests that import the kernels")
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The attention tests share their case builder, `kernels/paged_cases.py`.
sys.path.insert(0, str(Path(__file__).parent / "kernels"))
