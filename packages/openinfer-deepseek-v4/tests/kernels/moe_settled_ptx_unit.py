"""The FP4 experts' first decode launch compiled for sm90 down to PTX and through ptxas (no
GPU needed): settled, every global load before `griddepcontrol.wait` and every store after;
unsettled, no load before it. Run by test_fp4_moe_settled.py in a pytest process of its own
with TRITON_INTERPRET=0."""

from __future__ import annotations

import pytest
import triton
from triton.compiler import ASTSource

from openinfer_deepseek_v4.kernels.moe.decode import _gate_up_kernel
from openinfer_kernels.testing.ttir import TARGET

SIGNATURE = {"x_ptr": "*bf16", "ids_ptr": "*i64", "rw_ptr": "*fp32", "w_ptr": "*u8",
             "s_ptr": "*u8", "h_ptr": "*bf16", "N": "i32", "K": "i32", "top_k": "i32",
             "stride_xm": "i32", "stride_ids": "i32", "stride_rw": "i32", "stride_we": "i64",
             "stride_wn": "i32", "stride_se": "i64", "stride_sn": "i32", "stride_hm": "i32",
             "limit": "fp32"}


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "unsettled"])
def test_settled_loads_come_before_the_wait_and_stores_after(settled: bool) -> None:
    constexprs = {"BLOCK_N": 16, "BLOCK_K": 512, "EVEN_K": True, "PDL": True,
                  "SETTLED": settled}
    signature = {**SIGNATURE, **{name: "constexpr" for name in constexprs}}
    compiled = triton.compile(ASTSource(_gate_up_kernel, signature, constexprs), target=TARGET)
    assert compiled.asm["cubin"], "ptxas made no cubin"
    order = []
    for line in str(compiled.asm["ptx"]).splitlines():
        words = line.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if "griddepcontrol.wait" in line:
            order.append("wait")
        elif words and words[0].startswith(("ld.global", "st.global")):
            order.append(words[0][:2])
    assert order.count("wait") == 1
    wait = order.index("wait")
    before, after = order[:wait], order[wait + 1:]
    if settled:
        assert "ld" in before and "st" not in before
        assert "ld" not in after and "st" in after
    else:
        assert before == [] and "ld" in after
