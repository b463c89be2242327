"""Which small-batch linear runs at which shape: a fixed table, measured on the lent H100 80GB
by benchmarks/device/small_gemm.py (run 36, commit 13eab8f): for each weight shape (N, K), the
fastest Triton tile at M = 1 and at M = 16 (used for 2..16 rows), where it beat cuBLAS. Shapes
not in the table, and M > 16, stay on cuBLAS."""

from __future__ import annotations

from openinfer_kernels.gemm.triton import Tile

# (N, K): (tile at M = 1, tile at M = 16); Qwen3-4B's decode GEMMs.
TILES: dict[tuple[int, int], tuple[Tile, Tile]] = {
    (6144, 2560): (Tile(8, 512, 1, 8), Tile(64, 256)),  # qkv: 1.22x / 1.31x the floor
    (2560, 4096): (Tile(4, 512, 4), Tile(32, 256)),  # o: 1.51x / 1.55x
    (19456, 2560): (Tile(16, 512), Tile(32, 256)),  # gate_up: 1.07x / 1.15x
    (2560, 9728): (Tile(16, 512, 4), Tile(32, 128, 4)),  # down: 1.26x / 1.34x
}


def tile_for(m: int, n: int, k: int) -> Tile | None:
    """The table's tile for an [m, k] x [n, k]^T product, or None (cuBLAS)."""
    pair = TILES.get((n, k))
    if pair is None or m > 16:
        return None
    return pair[0] if m == 1 else pair[1]
