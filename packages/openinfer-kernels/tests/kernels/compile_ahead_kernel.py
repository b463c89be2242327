"""A module-level Triton kernel for test_compile_ahead.py (a worker process imports it)."""

import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)
