"""The decode-size kernels that read ahead of their PDL wait, compiled for sm90 down to PTX
and through ptxas (no GPU needed): exactly the loads meant to come before
`griddepcontrol.wait` do (counted per thread: the signatures below carry no divisibility, so
each element is its own load), and the rest follow it. Run by test_pdl_reads.py in a pytest
process of its own with TRITON_INTERPRET=0."""

from __future__ import annotations

from typing import Any

import pytest

from openinfer_kernels.attention.split import _split_kernel
from openinfer_kernels.collective.push_triton import _push_data_add_rms_norm_kernel
from openinfer_kernels.fp8_linear.triton import _fp8_linear_kernel
from openinfer_kernels.gemm.triton import _linear_kernel
from openinfer_kernels.testing.ptx import around_the_wait, compile_ptx

THREADS = 128  # triton.compile's default 4 warps


def _loads(kernel: Any, signature: dict[str, Any], constexprs: dict[str, Any]
           ) -> tuple[list[str], list[str]]:
    """The global loads' widths (b16, b32, ...) before and after the PTX's one
    `griddepcontrol.wait`."""
    before, after = around_the_wait(compile_ptx(kernel, signature, constexprs))
    return ([op.rsplit(".", 1)[-1] for op in before if op.startswith("ld.")],
            [op.rsplit(".", 1)[-1] for op in after if op.startswith("ld.")])


SPLIT = {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
         "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32",
         "out_ptr": "*bf16", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32",
         "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32", "count_ptr": "*i32",
         "scale_log2": "fp32", "num_seqs": "i32", "num_splits": "i32", "num_tokens": "i32",
         **{name: "i32" for name in ("stride_qt", "stride_qh", "stride_kb", "stride_ks",
                                     "stride_kh", "stride_vb", "stride_vs", "stride_vh",
                                     "stride_bt", "stride_ot", "stride_oh")}}


@pytest.mark.parametrize("preload", [True, False], ids=["preload", "off"])
@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prompt"])
def test_split_attention_reads_its_first_keys_before_the_wait_at_decode(decode: bool,
                                                                       preload: bool) -> None:
    block_n, block_d, block_g = 64, 128, 16 if decode else 4
    before, after = _loads(_split_kernel, SPLIT, {
        "GROUP": 4, "HEAD_DIM": block_d, "PAGE": 16, "SPLIT": True, "DECODE": decode,
        "BLOCK_Q": 1 if decode else 16, "BLOCK_G": block_g, "BLOCK_N": block_n,
        "BLOCK_D": block_d, "PRECISION": "ieee", "UPCAST": False, "PDL": True,
        "KV_FP8": False, "HEAVY_FIRST": not decode, "SERIAL": False, "PRELOAD": preload})
    if not (decode and preload):  # prompt steps wait first, as every step without PRELOAD
        assert before == []
        return
    # Before: the step's metadata and block table (32-bit) and the first tile's keys and
    # values (bf16), nothing more; q (a query's group of heads) and the new keys after.
    tile = 2 * block_n * block_d // THREADS
    assert before.count("b16") == tile and set(before) == {"b16", "b32"}
    assert after.count("b16") >= tile + block_g * block_d // THREADS


PUSH = {"x_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16",
        "sum_ptr": "*bf16", "areas": ("*bf16", "*bf16"), "seq_ptr": "*i32", "H": "i32",
        "x_row_stride": "i32", "res_row_stride": "i32", "eps": "fp32", "share_stride": "i32"}


@pytest.mark.parametrize("preload", [True, False], ids=["preload", "off"])
@pytest.mark.parametrize("add_norm", [True, False], ids=["add-norm", "sum-alone"])
def test_push_reads_the_residual_and_weight_before_the_wait(add_norm: bool,
                                                           preload: bool) -> None:
    h = 4096
    before, after = _loads(_push_data_add_rms_norm_kernel, PUSH, {
        "RANK": 0, "WORLD": 2, "PROGRAMS": 64, "BITS": 16, "BLOCK_H": h, "PDL": True,
        "ADD_NORM": add_norm, "SHARES": 0, "PRELOAD": preload, "COPIES": False})
    # The residual row and the weight before; x (and the peers' rows, volatile) after.
    assert before == (["b16"] * (2 * h // THREADS) if add_norm and preload else [])
    assert after.count("b16") >= h // THREADS


LINEAR = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "final_ptr": "*bf16",
          "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
          "stride_wn": "i32", "stride_om": "i32", "k_per_split": "i32"}


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("preload", [False, True], ids=["off", "preload"])
def test_linear_preloads_its_first_weight_tile_before_the_wait(gated: bool,
                                                               preload: bool) -> None:
    block_n, block_k = 16, 512
    before, after = _loads(_linear_kernel, LINEAR, {
        "M_PAD": 1, "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": 1, "GATED": gated,
        "SERIAL": False, "PRECISION": "ieee", "UPCAST": False, "PDL": True, "PREFETCH": 0,
        "LINE": 64, "PRELOAD": preload})
    tiles = (2 if gated else 1) * block_n * block_k // THREADS
    # The first weight tile (both, gated) before; x and the other tiles after.
    assert before == (["b16"] * tiles if preload else [])
    assert after.count("b16") >= tiles


FP8 = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "s_ptr": "*u8", "out_ptr": "*bf16",
       "final_ptr": "*bf16", "count_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
       "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32", "k_per_split": "i32",
       "rows_per_group": "i32", "stride_xg": "i32"}


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("preload", [False, True], ids=["off", "preload"])
def test_fp8_linear_preloads_its_first_step_before_the_wait(gated: bool,
                                                            preload: bool) -> None:
    block_n, block_k = 16, 512
    before, after = _loads(_fp8_linear_kernel, FP8, {
        "BLOCK_M": 1, "BLOCK_N": block_n, "BLOCK_K": block_k, "SUB": 128,
        "PRECISION": "ieee", "UPCAST": False, "E8M0": True, "PDL": True, "PREFETCH": 0,
        "GATED": gated, "SERIAL": False, "LIMIT": 0.0, "PRELOAD": preload})
    # The first step's e4m3 tiles (a byte an element) and their scale bytes, both gated,
    # before; x (bf16) after.
    assert "b16" in after
    if not preload:
        assert before == []
        return
    products = 2 if gated else 1
    assert set(before) == {"b8"}
    assert before.count("b8") >= products * block_n * block_k // THREADS
