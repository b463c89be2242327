"""The FP4 experts' first decode launch compiled for sm90 down to PTX and through ptxas (no
GPU needed): settled, every global load before `griddepcontrol.wait` and every store after;
unsettled, no load before it. Run by test_fp4_moe_settled.py in a pytest process of its own
with TRITON_INTERPRET=0."""

from __future__ import annotations

import pytest

from openinfer_deepseek_v4.kernels.moe.decode import _gate_up_kernel
from openinfer_kernels.testing.ptx import around_the_wait, compile_ptx

SIGNATURE = {"x_ptr": "*bf16", "ids_ptr": "*i64", "rw_ptr": "*fp32", "w_ptr": "*u8",
             "s_ptr": "*u8", "h_ptr": "*bf16", "N": "i32", "K": "i32", "top_k": "i32",
             "stride_xm": "i32", "stride_ids": "i32", "stride_rw": "i32", "stride_we": "i64",
             "stride_wn": "i32", "stride_se": "i64", "stride_sn": "i32", "stride_hm": "i32",
             "limit": "fp32"}


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "unsettled"])
def test_settled_loads_come_before_the_wait_and_stores_after(settled: bool) -> None:
    before, after = around_the_wait(compile_ptx(_gate_up_kernel, SIGNATURE, {
        "BLOCK_N": 16, "BLOCK_K": 512, "EVEN_K": True, "PDL": True, "SETTLED": settled}))
    loads = [op for op in before + after if op.startswith("ld.")]
    assert loads
    if settled:  # every load before, every store after
        assert all(op.startswith("ld.") for op in before) and len(before) == len(loads)
        assert after and all(op.startswith("st.") for op in after)
    else:
        assert before == []
