"""DeepSeek-V4-Flash attention kernels at serving shapes, on CUDA: `sparse_sink_attention` (64
heads x 512, bf16, a 128-entry window plus 512 compressed entries: CSA's random top 512 of a 64k
context, HCA's 512 consecutive entries of one) and the paged indexer (64 heads x 128, top 512,
8k and 64k contexts), decode batches of 1 and 64, each request its own rows.

Each kernel time is one call's share of a CUDA graph (the GPU's time, no launch gaps), printed
against its bytes-read floor: the bytes a kernel must read (rows, queries, slot lists) over the
read bandwidth of a device copy measured in the same run (a copy of N bytes reads N: its time
gives N / t). The reference ops (plain torch on the GPU) are the baseline. Also tries a few tile
settings of the attention. Usage: python dsv4_attention_bench.py [--json PATH] (about a minute
on an H100)"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
from cuda_timing import copy_bandwidth, graph_per_call_us, median_us

from openinfer_deepseek_v4.kernels.indexer import indexer_topk_paged_ref
from openinfer_deepseek_v4.kernels.indexer.triton import (
    indexer_topk_paged_triton,
    indexer_topk_triton,
)
from openinfer_deepseek_v4.kernels.sparse_attention import sparse_sink_attention_ref
from openinfer_deepseek_v4.kernels.sparse_attention.triton import (
    MAX_SPLITS,
    plan,
    sparse_sink_attention_triton,
)


def median_ms(fn: Callable[[], object], reps: int = 50) -> float:
    """Eager: the median CUDA-event time of single calls (the references)."""
    return median_us(fn, reps) / 1e3


def kernel_ms(fn: Callable[[], object]) -> float:
    """The GPU's time: one call's share of a CUDA graph of 8 (as in a captured decode step;
    batch 1's few rows stay in L2 between calls)."""
    return graph_per_call_us([fn] * 8) / 1e3


HEADS, DIM, WINDOW, PICKED = 64, 512, 128, 512
INDEX_HEADS, INDEX_DIM, TOP_K, RATIO, BLOCK = 64, 128, 512, 4, 64


def attention_case(batch: int, kind: str) -> tuple[tuple[object, ...], int]:
    """Inputs for one decode step of `batch` requests (64k contexts) and the bytes it reads."""
    entries = 65536 // (RATIO if kind == "csa" else 128)
    kv_pool = torch.randn(batch * 256, DIM, device="cuda", dtype=torch.bfloat16)
    entry_pool = torch.randn(batch * entries, DIM, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    rows = torch.arange(batch, device="cuda")[:, None]
    window = (rows * 256 + torch.randperm(256, device="cuda")[:WINDOW]).int()
    if kind == "csa":
        chosen = torch.rand(batch, entries, device="cuda").argsort(-1)[:, :PICKED]
    else:
        chosen = torch.arange(entries, device="cuda").expand(batch, -1)
    picked = (rows * entries + chosen).int()
    sinks = torch.randn(HEADS, device="cuda")
    read = (q.numel() * 2 + batch * (WINDOW + PICKED) * (DIM * 2 + 4) + HEADS * 4)
    return (q, kv_pool, entry_pool, window, picked, sinks, DIM ** -0.5), read


def indexer_case(batch: int, context: int) -> tuple[dict[str, object], int]:
    entries = context // RATIO
    blocks = context // BLOCK
    pool = torch.randn(batch * blocks + 1, BLOCK // RATIO, INDEX_DIM, device="cuda",
                       dtype=torch.bfloat16)
    tables = (1 + torch.randperm(batch * blocks, device="cuda")).view(batch, blocks).int()
    step: dict[str, object] = dict(
        q=torch.randn(batch, INDEX_HEADS, INDEX_DIM, device="cuda", dtype=torch.bfloat16),
        weights=torch.randn(batch, INDEX_HEADS, device="cuda"), index_pool=pool,
        block_tables=tables, query_start_loc=torch.arange(batch + 1, device="cuda").int(),
        positions=torch.full((batch,), context - 1, device="cuda"), ratio=RATIO,
        block_size=BLOCK, top_k=TOP_K, softmax_scale=INDEX_DIM ** -0.5,
        weights_scale=INDEX_HEADS ** -0.5, as_slots=True)
    read = batch * (entries * INDEX_DIM * 2 + INDEX_HEADS * (INDEX_DIM * 2 + 4) + blocks * 4)
    return step, read


def row(name: str, ms: float, ref_ms: float, read: int, bandwidth: float,
        extra: str = "") -> dict[str, object]:
    floor_ms = read / bandwidth * 1e3
    print(f"{name:34s} {ms * 1e3:9.1f} us  floor {floor_ms * 1e3:7.1f} us "
          f"({floor_ms / ms:6.1%})  reference {ref_ms * 1e3:9.1f} us  {extra}")
    return {"case": name, "us": ms * 1e3, "floor_us": floor_ms * 1e3, "ref_us": ref_ms * 1e3,
            "extra": extra}


def attention_rows(bandwidth: float) -> list[dict[str, object]]:
    rows = []
    for kind in ("csa", "hca"):
        for batch in (1, 64):
            args, read = attention_case(batch, kind)
            planned = plan(batch, HEADS, DIM, WINDOW + PICKED, torch.device("cuda"))
            plan_ms = kernel_ms(lambda a=args: sparse_sink_attention_triton(*a))
            best = (plan_ms, "plan")
            for block_h, block_n, warps in ((16, 32, 4), (16, 64, 8), (32, 32, 8)):
                for splits in sorted({planned[2], max(1, planned[2] // 2),
                                      min(MAX_SPLITS, 2 * planned[2])}):
                    ms = kernel_ms(lambda a=args, s=splits, h=block_h, n=block_n, w=warps:
                                   sparse_sink_attention_triton(*a, num_splits=s, block_h=h,
                                                                block_n=n, num_warps=w))
                    if ms < best[0]:
                        best = (ms, f"h{block_h} n{block_n} w{warps} s{splits}")
            ref_ms = median_ms(lambda a=args: sparse_sink_attention_ref(*a), reps=5)
            rows.append(row(f"sparse attention {kind} B={batch}", plan_ms, ref_ms, read,
                            bandwidth, f"plan {planned}; best {best[1]} {best[0] * 1e3:.1f} us"))
            torch.cuda.empty_cache()
    return rows


def indexer_rows(bandwidth: float) -> list[dict[str, object]]:
    rows = []
    for context in (8192, 65536):
        for batch in (1, 64):
            step, read = indexer_case(batch, context)
            ms = kernel_ms(lambda s=step: indexer_topk_paged_triton(**s))
            ref_ms = median_ms(lambda s=step: indexer_topk_paged_ref(**s),
                               reps=3)
            scores = torch.randn(batch, context // RATIO, device="cuda")
            positions = step["positions"]
            topk_ms = kernel_ms(lambda s=scores, p=positions: indexer_topk_triton(
                s, p, ratio=RATIO, top_k=TOP_K))
            rows.append(row(f"indexer {context // 1024}k B={batch}", ms, ref_ms, read,
                            bandwidth, f"of which top-k ~{topk_ms * 1e3:.1f} us"))
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy reads {bandwidth / 1e12:.2f} TB/s")
    rows = attention_rows(bandwidth) + indexer_rows(bandwidth)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bandwidth": bandwidth, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
