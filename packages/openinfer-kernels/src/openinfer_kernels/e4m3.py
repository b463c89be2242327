# mypy: disable-error-code="no-untyped-def"
"""`round_to_e4m3`: fp32 values rounded to the e4m3 grid in fp32, so that the cast to e4m3 that
follows is exact. The GPU's cast rounds the same way; the Triton interpreter's truncates
subnormals and drops the carry into the next power of two, so rounding first makes both agree
with torch's cast, the references'.
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_e4m3(v):
    """fp32 v (|v| <= 448) rounded to the nearest e4m3 value, ties to even, still fp32: a
    multiple of the e4m3 step at v's exponent (2^(e - 3) for |v| in [2^e, 2^(e+1)), e >= -6;
    the subnormals' 2^-9 below 2^-6). |v| / step is at most 16, so adding and taking away 2^23
    rounds it to an integer (fp32 keeps no fraction bits there); powers of two throughout keep
    the rest exact. v's sign bit is put back as a bit, so that what rounds to zero stays -0
    where v was negative, as torch's cast gives (a negation of +0 there came out +0 compiled
    on an H100: `gpu_check.sh preload`, test_kv_fp8.py)."""
    bits = v.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    step_bits = (tl.maximum(exponent, -6) - 3 + 127) << 23
    step = step_bits.to(tl.float32, bitcast=True)
    inverse = ((254 << 23) - step_bits).to(tl.float32, bitcast=True)  # 1 / step
    rounded = ((tl.abs(v) * inverse + 8388608.0) - 8388608.0) * step
    return (rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32,
                                                                           bitcast=True)
