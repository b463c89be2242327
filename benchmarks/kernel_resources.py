"""Registers and spills of the paged attention kernels, compiled for the H100 (sm_90a) on a
machine without a GPU: Triton compiles each variant to a cubin and the `cuobjdump` that ships
with Triton reads its resource usage. Run it with the device image's Triton (3.6) for figures
that match the GPU runs: `pip install triton==3.6.0` into a venv with torch, then
`TRITON_INTERPRET=0 PYTHONPATH=packages/openinfer-kernels/src:packages/openinfer-core/src
python benchmarks/kernel_resources.py`."""

from __future__ import annotations

import inspect
import os
import subprocess
import tempfile
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from openinfer_kernels.attention import prefill as prefill_kernels
from openinfer_kernels.attention import split as split_kernels

POINTERS = {"q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
            "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32",
            "out_ptr": "*bf16", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
FLOATS = {"scale_log2"}
QWEN3_8B = dict(GROUP=4, HEAD_DIM=128, PAGE=16, BLOCK_D=128, PRECISION="tf32", UPCAST=False,
                PDL=True)


def resources(fn: Any, constexprs: dict[str, Any], num_warps: int, num_stages: int) -> str:
    """cuobjdump's resource line (REG, STACK, SHARED, ...) of one compiled variant. Pointers
    and the integer arguments Triton specializes on (all but `do_not_specialize`'s) are marked
    16-byte divisible, as they are at Qwen3-8B's shapes on the GPU: without that mark Triton
    cannot prove the K/V loads aligned and compiles them without async copies, a different
    kernel from the one that runs."""
    names = list(inspect.signature(fn.fn).parameters)
    signature = {name: "constexpr" if name in constexprs else POINTERS.get(
        name, "fp32" if name in FLOATS else "i32") for name in names}
    unspecialized = set(fn.do_not_specialize) | FLOATS
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if name not in constexprs and name not in unspecialized}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                                      attrs=attrs),
                            target=GPUTarget("cuda", 90, 128),
                            options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    return next((line.strip() for line in out.splitlines() if "REG:" in line), "?")


def main() -> None:
    split = {**QWEN3_8B, "SPLIT": False, "HEAVY_FIRST": True}
    cases: dict[str, tuple[Any, dict[str, Any], int, int]] = {
        "split, decode (16 rows)": (split_kernels._split_kernel, {
            **split, "SPLIT": True, "DECODE": True, "BLOCK_Q": 1, "BLOCK_G": 16,
            "BLOCK_N": 64, "HEAVY_FIRST": False}, 4, 2),
        "split, prompt (64 rows), 4 warps": (split_kernels._split_kernel, {
            **split, "DECODE": False, "BLOCK_Q": 16, "BLOCK_G": 4, "BLOCK_N": 64}, 4, 3),
        "split, prompt (64 rows), 8 warps": (split_kernels._split_kernel, {
            **split, "DECODE": False, "BLOCK_Q": 16, "BLOCK_G": 4, "BLOCK_N": 64}, 8, 3),
        "split, prompt (128 rows), 4 warps": (split_kernels._split_kernel, {
            **split, "DECODE": False, "BLOCK_Q": 32, "BLOCK_G": 4, "BLOCK_N": 64}, 4, 3),
        "prefill, 64 queries": (prefill_kernels._prefill_kernel, {
            **QWEN3_8B, "BLOCK_M": 64, "BLOCK_N": 64, "HEAVY_FIRST": True}, 4, 2),
        "prefill, 128 queries": (prefill_kernels._prefill_kernel, {
            **QWEN3_8B, "BLOCK_M": 128, "BLOCK_N": 64, "HEAVY_FIRST": True}, 4, 3),
        "merge (sanity: a small kernel)": (split_kernels._merge_kernel, {
            "HEAD_DIM": 128, "BLOCK_S": 16, "BLOCK_D": 128, "PDL": True}, 1, 2),
    }
    print(f"triton {triton.__version__}, sm_90a, Qwen3-8B heads")
    for name, (fn, constexprs, warps, stages) in cases.items():
        print(f"{name:36} {resources(fn, constexprs, warps, stages)}")


if __name__ == "__main__":
    main()
