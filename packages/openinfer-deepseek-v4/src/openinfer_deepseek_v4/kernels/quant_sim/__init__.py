"""DeepSeek-V4's rounding inside its forward (`quant_sim.py` says when): `fp8_round_nope` and
`fp8_round_rows` (raw and main compressed entries: their non-rotary dims to FP8 e4m3),
`indexer_round` and `indexer_round_rows` (the indexer's queries and keys: Hadamard-rotated,
then to FP4 e2m1); the `_rows` forms round rows of a cache pool in place. A Triton kernel on
CUDA tensors, the references on CPU."""

from openinfer_deepseek_v4.kernels.quant_sim.reference import (
    fp4_round,
    fp8_round,
    fp8_round_nope,
    fp8_round_rows_ref,
    hadamard,
    hadamard_matrix,
    indexer_round_ref,
    indexer_round_rows_ref,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.quant_sim.triton")

fp8_round_rows = by_device(fp8_round_rows_ref,
                           _kernels.fp8_round_rows_triton if _kernels else None)
indexer_round = by_device(indexer_round_ref, _kernels.indexer_round_triton if _kernels else None)
indexer_round_rows = by_device(indexer_round_rows_ref,
                               _kernels.indexer_round_rows_triton if _kernels else None)

__all__ = ["fp4_round", "fp8_round", "fp8_round_nope", "fp8_round_rows", "fp8_round_rows_ref",
           "hadamard", "hadamard_matrix", "indexer_round", "indexer_round_ref",
           "indexer_round_rows", "indexer_round_rows_ref"]
