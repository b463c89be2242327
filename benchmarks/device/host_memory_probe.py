"""Where an idle engine's resident host memory goes, finer than the start-up log's phases:
the CUDA context, cuBLAS, the engine's build, each deferred CUDA graph, the text of every
compiled Triton kernel's intermediate code (Triton keeps its TTIR, TTGIR, LLVM IR and PTX in
memory for each variant it loads), and the largest mappings at the end.
Usage: python host_memory_probe.py MODEL_DIR [--json F]  (weights made up, --load-format dummy)"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import logging
import re
import time

from openinfer_core.startup.host_memory import release_host_memory, resident_mb

marks: list[tuple[str, float]] = []


def mark(name: str) -> None:
    marks.append((name, round(resident_mb(), 1)))
    print(f"{name:40} {marks[-1][1]:8.1f} MB", flush=True)


def by_mapping(top: int = 16) -> dict[str, float]:
    """Resident MB by mapping name (/proc/self/smaps), the largest first."""
    out: collections.Counter[str] = collections.Counter()
    name = "[anonymous]"
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split()
                name = parts[5].rsplit("/", 1)[-1] if len(parts) > 5 else "[anonymous]"
            elif line.startswith("Rss:"):
                out[name] += int(line.split()[1]) / 1024
    return {k: round(v, 1) for k, v in out.most_common(top)}


def triton_kernels() -> list:
    """Every compiled Triton kernel loaded in this process."""
    from triton.runtime.jit import JITFunction
    kernels = []
    for obj in gc.get_objects():
        if isinstance(obj, JITFunction):
            for caches in obj.device_caches.values():
                kernels.extend(caches[0].values())
    return kernels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the engine's phase log
    mark("python + openinfer_core.host_memory")
    import torch
    mark("import torch")
    import triton  # noqa: F401
    mark("import triton")
    torch.zeros(1, device="cuda")
    mark("CUDA context")
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    mark("first cuBLAS matmul")
    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine
    mark("import the engine")
    engine = Engine(EngineConfig(model=args.model, load_format="dummy"), defer_graphs=True)
    mark("engine built (start-up graphs)")
    engine.idle_work()  # the first idle turn hands loading's garbage back
    mark("host memory released")
    graphs = len(engine.graphs.pending) if engine.graphs is not None else 0
    started = time.perf_counter()
    per_graph = []
    while True:
        before = resident_mb()
        more = engine.idle_work()
        per_graph.append(round(resident_mb() - before, 1))
        if not more:
            break
    capture_s = time.perf_counter() - started
    mark(f"{graphs} deferred graphs captured")
    print("MB each capture added:", per_graph)
    stats = getattr(torch.cuda.memory, "host_memory_stats", None)
    if stats is not None:
        print("pinned host memory:", {k: v for k, v in stats().items()
                                      if "bytes" in k and "current" in k})
    kernels = triton_kernels()
    text_mb = sum(len(v) for k in kernels for key, v in k.asm.items() if key != "cubin") / 2**20
    cubin_mb = sum(len(k.asm.get("cubin", b"")) for k in kernels) / 2**20
    print(f"triton: {len(kernels)} kernels, {text_mb:.1f} MB of IR text, {cubin_mb:.1f} MB cubin")
    for k in kernels:  # what a loaded kernel never reads again
        for key in [key for key in k.asm if key != "cubin"]:
            del k.asm[key]
    release_host_memory()
    mark("Triton IR text dropped")
    report = {"marks": marks, "deferred_graphs": graphs, "deferred_capture_s": capture_s,
              "mb_each_capture": per_graph,
              "triton_kernels": len(kernels), "triton_ir_text_mb": text_mb,
              "triton_cubin_mb": cubin_mb, "by_mapping_mb": by_mapping()}
    print(json.dumps(report["by_mapping_mb"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
