"""How fast a restore's blocks can reach the paged KV cache: one pinned host-to-device copy of
the same bytes (the floor), the host tier's staged path (DMA into a device buffer, then a
scatter kernel), checked byte for byte, and how much a restore slows the compute stream beside
it. (A kernel reading pinned host memory directly was tried at fcc763e: 1.08x of the floor at
best against 1.05x staged, and it takes SMs from the steps; see run 30.)
Qwen3-4B's KV layout (36 layers of K and V, 8 heads x 128, bf16, 16-token blocks).

Usage: python offload_copy.py [--blocks 1023] [--json F]"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from openinfer_offload.block_copy import BlockMover
from openinfer_offload.copier import DeviceCopier

LAYERS, HEADS, HEAD_DIM, BLOCK = 36, 8, 128, 16


def best_ms(fn: Callable[[], Any], reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=1023)  # a 16k prompt
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    n = args.blocks
    pool_blocks = 3 * n
    tensors = [torch.zeros((pool_blocks, BLOCK, HEADS, HEAD_DIM), dtype=torch.bfloat16,
                           device="cuda") for _ in range(2 * LAYERS)]
    block_bytes = sum(t[0].nbytes for t in tensors)
    pool = torch.empty((2 * n, block_bytes), dtype=torch.uint8, pin_memory=True)
    pool.view(-1).copy_(torch.randint(0, 256, (pool.numel(),), dtype=torch.uint8,
                                      device="cuda"))
    nbytes = n * block_bytes
    g = torch.Generator().manual_seed(0)
    ids = torch.randperm(pool_blocks, generator=g)[:n].tolist()  # scattered device blocks
    consecutive = list(range(n))
    scattered = sorted(torch.randperm(2 * n, generator=g)[:n].tolist())  # runs of ~2 slots
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "blocks": n,
                              "bytes": nbytes, "block_bytes": block_bytes}
    flat_dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    flat_host = pool[:n].view(-1)
    result["floor_ms"] = best_ms(lambda: flat_dev.copy_(flat_host, non_blocking=True))

    def expect(slots: list[int]) -> None:
        rows = torch.empty((n, block_bytes), dtype=torch.uint8, device="cuda")
        BlockMover(tensors).gather(torch.tensor(ids, device="cuda"), rows)
        if not torch.equal(rows.cpu(), pool[slots]):
            raise SystemExit("a restore copy moved the wrong bytes")

    copier = DeviceCopier(tensors, pool)
    for name, slots in (("staged_consecutive", consecutive), ("staged_scattered", scattered)):
        result[f"{name}_ms"] = best_ms(lambda s=slots: copier.to_device(s, ids))  # type: ignore[misc]
        expect(slots)
    result["d2h_floor_ms"] = best_ms(lambda: flat_host.copy_(flat_dev, non_blocking=True))
    result["staged_save_ms"] = best_ms(lambda: copier.to_host(ids, consecutive))
    # What a restore costs the steps running beside it: a matmul loop on the compute stream,
    # timed by events on that stream, alone and with a staged restore in flight.
    a = torch.randn((4096, 4096), dtype=torch.bfloat16, device="cuda")

    def matmuls_ms(copy: Callable[[], Any] | None) -> float:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if copy is not None:
            copy()  # on the copier's stream
        start.record()
        for _ in range(40):
            a @ a
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    matmuls_ms(None)
    result["matmul_alone_ms"] = min(matmuls_ms(None) for _ in range(3))
    result["matmul_beside_restore_ms"] = min(
        matmuls_ms(lambda: copier.to_device(consecutive, ids)) for _ in range(3))
    torch.cuda.synchronize()
    floor = result["floor_ms"]
    print(f"{n} blocks, {nbytes / 1e9:.2f} GB: floor {floor:.1f} ms "
          f"({nbytes / floor / 1e6:.1f} GB/s)")
    for key, value in result.items():
        if key.endswith("_ms") and key != "floor_ms":
            ratio = f"{value / floor:5.2f}x of the floor" if key.startswith("staged") else ""
            print(f"  {key:32s} {value:7.1f} ms  {ratio}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
