"""How fast a restore's blocks can reach the paged KV cache: one pinned host-to-device copy of
the same bytes (the floor), the host tier's staged path (DMA into a device buffer, then a
scatter kernel), and a kernel that reads pinned host memory directly, by grid size. Each
variant is checked byte for byte; also how much a direct copy slows a matmul running beside
it. Qwen3-4B's KV layout (36 layers of K and V, 8 heads x 128, bf16, 16-token blocks).

Usage: python offload_copy.py [--blocks 1023] [--json F]"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from openinfer_offload.block_copy import triton as kernels
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
        kernels.gather_blocks(tensors, torch.tensor(ids, device="cuda"), rows)
        if not torch.equal(rows.cpu(), pool[slots]):
            raise SystemExit("a restore copy moved the wrong bytes")

    copier = DeviceCopier(tensors, pool)
    for name, slots in (("staged_consecutive", consecutive), ("staged_scattered", scattered)):
        result[f"{name}_ms"] = best_ms(lambda s=slots: copier.to_device(s, ids))  # type: ignore[misc]
        expect(slots)
    dev_ids = torch.tensor(ids, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    direct: dict[str, float] = {}
    for programs in (8, 16, 32, 64, sms, 2 * sms, 4 * sms):
        for name, slots in (("consecutive", consecutive), ("scattered", scattered)):
            dev_slots = torch.tensor(slots, device="cuda")
            direct[f"{programs}_{name}"] = best_ms(lambda s=dev_slots, pr=programs: kernels.host_copy(  # type: ignore[misc]
                tensors, dev_ids, pool, s, False, pr))
            expect(slots)
    result["direct_ms"] = direct
    # Saves the other way, direct, against the floor.
    result["d2h_floor_ms"] = best_ms(lambda: flat_host.copy_(flat_dev, non_blocking=True))
    dev_slots = torch.tensor(consecutive, device="cuda")
    result["direct_d2h_ms"] = {str(pr): best_ms(lambda pr=pr: kernels.host_copy(  # type: ignore[misc]
        tensors, dev_ids, pool, dev_slots, True, pr)) for pr in (16, 32, sms)}
    # Interference: a bf16 matmul loop alone, beside the staged copy, beside direct copies.
    a = torch.randn((4096, 4096), dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()

    def matmuls() -> None:
        for _ in range(50):
            a @ a

    def beside(copy: Callable[[], Any]) -> float:
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            copy()
        t = time.perf_counter()
        matmuls()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    alone = best_ms(matmuls)
    result["matmul_alone_ms"] = alone
    result["matmul_beside_staged_ms"] = beside(lambda: copier.to_device(consecutive, ids))
    for pr in (16, 32, sms):
        result[f"matmul_beside_direct_{pr}_ms"] = beside(lambda pr=pr: kernels.host_copy(  # type: ignore[misc]
            tensors, dev_ids, pool, dev_slots, False, pr))
    torch.cuda.synchronize()
    floor = result["floor_ms"]
    print(f"{n} blocks, {nbytes / 1e9:.2f} GB: floor {floor:.1f} ms "
          f"({nbytes / floor / 1e6:.1f} GB/s)")
    for key, value in result.items():
        if key.endswith("_ms") and isinstance(value, float) and key != "floor_ms":
            print(f"  {key:32s} {value:7.1f} ms  {value / floor:5.2f}x")
    for key, value in direct.items():
        print(f"  direct {key:25s} {value:7.1f} ms  {value / floor:5.2f}x")
    for key, value in result["direct_d2h_ms"].items():
        print(f"  direct d2h {key:21s} {value:7.1f} ms  {value / result['d2h_floor_ms']:5.2f}x "
              "of d2h floor")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
