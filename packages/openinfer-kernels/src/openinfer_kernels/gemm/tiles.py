"""Which small-batch linear runs at which shape: a fixed table, measured on the lent H100 80GB
(`python -m benchmarks.ops.run --ops small_linear --sweep` reruns the search): for each weight
shape (N, K), the fastest Triton tile at M = 1 and at M = 16 (used for 2..16 rows), or None
where cuBLAS was as fast. The gate/up rows are the gated form's (`linear_silu_mul`), which is
how models call them. Shapes not in the table, and M > 16, stay on cuBLAS. The comments give
time / read floor, Triton vs cuBLAS, each op's share of a CUDA graph over 1 GB of distinct
weights.

`SUM_FUSED_TILES` overrides `TILES` where the product feeds an add + RMSNorm that sums its
split-K shares itself (`linear_add_rms_norm`: o_proj and down): there a split tile costs no
launch of its own, so the best tile may differ from the one measured with the sum as a kernel
(`python -m benchmarks.ops.run --ops linear_add_norm --sweep` times every tile in that form)."""

from __future__ import annotations

from openinfer_kernels.gemm.triton import Tile

# (N, K): (tile at M = 1, tile at M = 16)
TILES: dict[tuple[int, int], tuple[Tile | None, Tile | None]] = {
    # Qwen3-4B
    (6144, 2560): (Tile(4, 512), Tile(64, 256)),  # qkv: M=1 1.23x vs 1.38x, M=16 1.30 vs 1.41
    (2560, 4096): (Tile(4, 512, 1, 8), Tile(32, 256)),  # o: 1.53 vs 1.64, 1.55 vs 1.68
    (19456, 2560): (Tile(8, 256), Tile(32, 128)),  # gate_up + silu: 1.08 vs 1.18, 1.11 vs 1.24
    (2560, 9728): (Tile(16, 512, 4), None),  # down: 1.27 vs 1.31; M=16 1.35 vs 1.34
    (151936, 2560): (Tile(4, 512), Tile(64, 256)),  # lm_head: 0.98 vs 1.06, 1.02 vs 1.09
    # Qwen3-8B
    (6144, 4096): (Tile(4, 512), Tile(64, 256)),  # qkv: 1.17 vs 1.45, 1.23 vs 1.29
    (4096, 4096): (Tile(4, 512), Tile(32, 256)),  # o: 1.27 vs 1.42, 1.29 vs 1.43
    (24576, 4096): (Tile(4, 512), Tile(32, 128)),  # gate_up + silu: 1.04 vs 1.13, 1.06 vs 1.15
    (4096, 12288): (Tile(16, 512, 2, 8), Tile(32, 256)),  # down: 1.13 vs 1.17, 1.16 vs 1.19
    # One rank's shard at tensor-parallel sizes 2 and 4, at M = 1 only, swept on one H200 of the
    # lent nvidia-h100-x4 (`gpu_check.sh tptiles`); M > 1 stays on cuBLAS. Comments: Triton vs
    # cuBLAS, time / read floor. 8B's gate_up shard at TP4 is 8B qkv's shape (GATED_TILES).
    (3072, 4096): (Tile(32, 256, 4, 8), None),  # 8B TP2 qkv: 1.42x vs 1.85x
    (4096, 2048): (Tile(4, 512, 1, 8), None),  # 8B TP2 o: 1.56 vs 1.76
    (12288, 4096): (Tile(8, 256, 2), None),  # 8B TP2 gate_up + silu: 1.10 vs 1.22
    (4096, 6144): (Tile(8, 512, 2), None),  # 8B TP2 down: 1.20 vs 1.36
    (5120, 5120): (Tile(16, 512, 2), None),  # 32B TP2 qkv: 1.20 vs 1.24
    (5120, 4096): (Tile(16, 512, 2), None),  # 32B TP2 o: 1.23 vs 1.33
    (25600, 5120): (Tile(32, 256, 1, 8), None),  # 32B TP2 gate_up + silu: 1.01 vs 1.12
    (5120, 12800): (Tile(16, 512, 2), None),  # 32B TP2 down: 1.05 vs 1.20
    (1536, 4096): (Tile(4, 512, 4), None),  # 8B TP4 qkv: 1.85 vs 2.49
    (4096, 1024): (Tile(4, 512, 1, 8), None),  # 8B TP4 o: 1.83 vs 2.57
    (4096, 3072): (Tile(16, 256, 4), None),  # 8B TP4 down: 1.39 vs 1.71
    (2560, 5120): (Tile(8, 512, 4), None),  # 32B TP4 qkv: 1.41 vs 1.73
    (5120, 2048): (Tile(4, 512), None),  # 32B TP4 o: 1.44 vs 1.58
    (12800, 5120): (Tile(16, 256, 2), None),  # 32B TP4 gate_up + silu: 1.07 vs 1.14
    (5120, 6400): (Tile(16, 512, 2), None),  # 32B TP4 down: 1.16 vs 1.18
    # Qwen3.5-4B (hidden 2560 as Qwen3-4B), swept with `--cases 3.5-4B` (gpu_check.sh
    # qwen35tiles, H100). Its o_proj and the linear layers' out_proj are Qwen3-4B's o shape,
    # (2560, 4096), above.
    (12352, 2560): (Tile(4, 512), Tile(32, 128)),  # in_proj: 1.09 vs 1.16, 1.13 vs 1.18
    (10240, 2560): (Tile(4, 512), Tile(32, 128)),  # q, k, v, gate: 1.11 vs 1.19, 1.16 vs 1.22
    (18432, 2560): (Tile(8, 512), Tile(32, 128)),  # gate_up + silu: 1.05 vs 1.19, 1.11 vs 1.23
    (2560, 9216): (Tile(8, 256, 4), Tile(64, 256, 2)),  # down: 1.21 vs 1.32, 1.28 vs 1.37
    (248320, 2560): (Tile(4, 512), Tile(64, 256)),  # lm_head (tied): 0.97 vs 1.07, 1.01 vs 1.26
    # DeepSeek-V4-Flash's plain bf16 weights (hidden 4096), swept with `--cases V4` on one
    # H200 (`gpu_check.sh dsv4gates`). Comments: Triton vs cuBLAS in us, M = 1 and M = 16.
    (256, 4096): (Tile(16, 256, 16), Tile(16, 256, 8)),  # router, indexer compr.: 3.2/6.2, 3.9/6.3
    (1024, 4096): (Tile(8, 256, 8), Tile(32, 128, 8)),  # CSA compressor: 4.7/6.9, 5.4/7.1
    (512, 4096): (Tile(16, 256, 16), Tile(32, 128, 8)),  # HCA compressor: 3.9/6.3, 4.4/6.6
    (64, 4096): (Tile(4, 512, 8), Tile(16, 256, 16)),  # indexer weights: 2.6/5.8, 3.3/5.9
    (2624, 4096): (Tile(16, 256, 4), Tile(32, 128, 4)),  # CSA layer's stack: 7.9/9.8, 8.6/10.0
}


# (N, K): (tile at M = 1, tile at M = 16) when the split-K sum is fused into the add + norm.
# Empty until measured: such products take TILES' tiles.
# Measured on the H100, each against the TILES choice + its add-norm.
SUM_FUSED_TILES: dict[tuple[int, int], tuple[Tile | None, Tile | None]] = {
    (2560, 4096): (Tile(4, 512, 2), Tile(32, 128, 4)),  # 4B o: 11.0 -> 10.1 us, M=16 12.0 -> 11.0
    (2560, 9728): (Tile(16, 512, 4), Tile(32, 128, 4)),  # 4B down: M=16 23.8 (cuBLAS) -> 22.2 us
    (4096, 4096): (Tile(16, 512, 2, 8), Tile(32, 256)),  # 8B o: M=1 15.2 -> 14.7 us
    (4096, 12288): (Tile(16, 512, 2, 8), Tile(64, 128, 4)),  # 8B down: M=16 40.6 -> 39.8 us
}


# (N, K): (tile at M = 1, tile at M = 16) for the gated form (`linear_silu_mul`) where a plain
# product of the same shape wants another tile: Qwen3-8B's gate_up shard at TP4 is 8B qkv's
# shape. Swept on one H200 of the lent nvidia-h100-x4 (`gpu_check.sh tptiles`).
GATED_TILES: dict[tuple[int, int], tuple[Tile | None, Tile | None]] = {
    (6144, 4096): (Tile(4, 512, 2), None),  # 8B TP4 gate_up + silu: 1.23x vs cuBLAS 1.43x
}


def tile_for(m: int, n: int, k: int, *, sum_fused: bool = False,
             gated: bool = False) -> Tile | None:
    """The table's tile for an [m, k] x [n, k]^T product, or None (cuBLAS). `sum_fused`: the
    product's split-K shares are summed by the add + norm kernel after it; `gated`: it is the
    gated form's [gate; up] product."""
    pair = SUM_FUSED_TILES.get((n, k)) if sum_fused else None
    pair = pair or (GATED_TILES.get((n, k)) if gated else None)
    pair = pair or TILES.get((n, k))
    if pair is None or m > 16:
        return None
    return pair[0] if m == 1 else pair[1]
