"""Tiny Triton kernels for the TTIR helper's tests, imported with the interpreter off
(`test_ttir.py` loads this file itself): only Triton's primitives, since the library functions
that are themselves @triton.jit (tl.sum, tl.cdiv) were made interpreted when the test process
imported triton."""

import triton
import triton.language as tl


@triton.jit
def _doubled_or_same(x, DOUBLE: tl.constexpr):
    # Two returns of different types behind a constexpr branch: the interpreter runs either
    # branch happily; Triton's front end compiles every return to one type and refuses.
    if DOUBLE:
        return x.to(tl.float32) * 2.0
    return x


@triton.jit
def two_return_types(x_ptr, out_ptr, DOUBLE: tl.constexpr):
    tl.store(out_ptr, _doubled_or_same(tl.load(x_ptr), DOUBLE))


@triton.jit
def _doubled_or_same_once(x, DOUBLE: tl.constexpr):
    if DOUBLE:  # noqa: SIM108 (a constexpr branch, kept as statements)
        out = x.to(tl.float32) * 2.0
    else:
        out = x.to(tl.float32)
    return out


@triton.jit
def one_return_type(x_ptr, out_ptr, DOUBLE: tl.constexpr):
    tl.store(out_ptr, _doubled_or_same_once(tl.load(x_ptr), DOUBLE))


@triton.jit
def every_argument(t_ptr, small, large, one, f, b, nothing, BLOCK: tl.constexpr = 16):
    tl.store(t_ptr + tl.arange(0, BLOCK), tl.load(t_ptr + tl.arange(0, BLOCK)))
