"""The small-batch linear kernels (bf16 and FP8) with the L2 prefetch of their weights, compiled
for sm90 down to PTX and through ptxas (no GPU needed): the prefetches come ahead of
`griddepcontrol.wait`, and none when it is off. Run by test_pdl_prefetch.py in a pytest process
of its own with TRITON_INTERPRET=0 (the interpreter patches what the compiler needs)."""

from __future__ import annotations

import pytest

from openinfer_kernels.fp8_linear.triton import _fp8_linear_kernel
from openinfer_kernels.gemm.triton import _linear_kernel
from openinfer_kernels.testing.ptx import compile_ptx as _ptx


def _order(ptx: str) -> list[str]:
    """The prefetch and grid-dependency instructions, in program order."""
    keep = ("prefetch.global.L2", "griddepcontrol.wait")
    return [word for line in ptx.splitlines() for word in keep if word in line]


LINEAR = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "final_ptr": "*bf16",
          "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
          "stride_wn": "i32", "stride_om": "i32", "k_per_split": "i32"}
FP8 = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*u8", "out_ptr": "*bf16",
       "final_ptr": "*bf16", "count_ptr": "*i32", "M": "i32",
       "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32",
       "k_per_split": "i32", "rows_per_group": "i32", "stride_xg": "i32"}


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("prefetch", [0, 16])
def test_linear_prefetches_before_it_waits(gated: bool, prefetch: int) -> None:
    ptx = _ptx(_linear_kernel, LINEAR, {
        "M_PAD": 1, "BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 1, "GATED": gated,
        "SERIAL": False, "PRECISION": "ieee", "UPCAST": False, "PDL": True,
        "PREFETCH": prefetch, "LINE": 64, "PRELOAD": False})
    order = _order(ptx)
    assert order.count("griddepcontrol.wait") == 1
    wait = order.index("griddepcontrol.wait")
    if prefetch == 0:
        assert order == ["griddepcontrol.wait"]
    else:
        # 16 rows x 16 lines (x2 gated) over 128 threads, all before the wait.
        assert order[:wait] == ["prefetch.global.L2"] * (4 if gated else 2)
        assert "prefetch.global.L2" not in order[wait:]


def test_fp8_linear_prefetches_before_it_waits() -> None:
    ptx = _ptx(_fp8_linear_kernel, FP8, {
        "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 512, "SUB": 128, "PRECISION": "ieee",
        "UPCAST": False, "E8M0": True, "PDL": True, "PREFETCH": 8, "GATED": False,
        "SERIAL": False, "LIMIT": 0.0, "PRELOAD": False})
    order = _order(ptx)
    wait = order.index("griddepcontrol.wait")
    assert order[:wait] and set(order[:wait]) == {"prefetch.global.L2"}
    assert "prefetch.global.L2" not in order[wait + 1:]


@pytest.mark.parametrize("gated", [False, True])
def test_the_last_share_counts_in_as_a_semaphore_does(gated: bool) -> None:
    """The split linear's in-kernel sum (`_sum_if_last`): after a CTA barrier one thread adds
    to the arrival count with acquire-release at GPU scope (no thread races it), the shares
    are read past L1 (.cg), and the count is put back by one thread."""
    ptx = _ptx(_linear_kernel, {**LINEAR, "out_ptr": "*fp32"}, {
        "M_PAD": 1, "BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 4, "GATED": gated,
        "SERIAL": True, "PRECISION": "ieee", "UPCAST": False, "PDL": True, "PREFETCH": 0,
        "LINE": 64, "PRELOAD": False})
    lines = [line.strip() for line in ptx.splitlines()]
    adds = [i for i, line in enumerate(lines) if "atom.global.gpu.acq_rel.add" in line]
    assert len(adds) == 1
    add = adds[0]
    predicate = lines[add].split()[0]  # "@%pN": set from the thread index being 0
    assert predicate.startswith("@%p")
    assert any(line.startswith(f"setp.eq.b32 \t{predicate[1:]},") or
               line.startswith(f"setp.eq.s32 \t{predicate[1:]},")
               for line in lines[:add]), "the count's atomic is not one thread's"
    stores = [i for i, line in enumerate(lines[:add]) if "st.global" in line]
    barriers = [i for i, line in enumerate(lines[:add]) if line.startswith("bar.sync")]
    assert stores and barriers and barriers[-1] > stores[-1], "no barrier after the share"
    assert sum("ld.global.cg" in line for line in lines[add:]) >= (8 if gated else 4)
    assert sum("atom.global.gpu.relaxed.exch" in line for line in lines[add:]) == 1
