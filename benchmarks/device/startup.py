"""Time from `openinfer serve` to a ready server (cold and warm Triton cache), where it went
(the engine's own start-up log: imports, weights, KV cache, CUDA graphs, warm-up), the kernel
variants a cold start compiles, and the idle resident memory of the API process and of the
engine process.
Usage: python startup.py MODEL_DIR [--load-format dummy|auto] [--json PATH] [extra serve flags]."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

# The engine process's start-up lines (openinfer_core ipc/engine_core.py and engine/engine.py).
IMPORTED = re.compile(r"engine modules .* imported in ([\d.]+) s")
ENGINE_READY = re.compile(r"engine ready in ([\d.]+) s \((.*)\)")
PHASE = re.compile(r"([a-z][a-z ]*) ([\d.]+) s")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_children(int(child))]
    return found


def _breakdown(lines: list[str]) -> dict[str, float]:
    """Seconds by phase, from the engine's log."""
    out: dict[str, float] = {}
    for line in lines:
        if m := IMPORTED.search(line):
            out["engine_imports"] = float(m.group(1))
        elif m := ENGINE_READY.search(line):
            out["engine_init"] = float(m.group(1))
            for name, value in PHASE.findall(m.group(2)):
                out[name.replace(" ", "_")] = float(value)
    return out


def _gpu_mb(pid: int) -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if fields and fields[0] == str(pid):
            return float(fields[1])
    return None


def one_start(model: str, cache: str, port: int, extra: list[str]) -> dict[str, object]:
    env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "openinfer_server.cli", "serve", model,
                             "--port", str(port), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        while True:
            if proc.poll() is not None:
                reader.join(5)
                raise RuntimeError(f"server exited: {''.join(lines)[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        ready = time.perf_counter() - started
        time.sleep(3)  # idle
        engine = _children(proc.pid)  # the engine process (and multiprocessing's tracker)
        return {"ready_s": ready, "phases_s": _breakdown(lines),
                "idle_rss_mb": _rss_mb(proc.pid),
                "engine_rss_mb": sum(_rss_mb(pid) for pid in engine),
                "gpu_mb": _gpu_mb(proc.pid) or next(
                    (mb for pid in engine if (mb := _gpu_mb(pid))), None)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _compiled(cache: str) -> dict[str, int]:
    """Kernel variants the cold start compiled, by kernel name (Triton's cache holds one
    .cubin per compiled specialization)."""
    counts: dict[str, int] = {}
    for cubin in Path(cache).rglob("*.cubin"):
        counts[cubin.stem] = counts.get(cubin.stem, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--json")
    ap.add_argument("--port", type=int, default=8123)
    args, extra = ap.parse_known_args()
    cache = tempfile.mkdtemp(prefix="triton-cache-")
    try:
        cold = one_start(args.model, cache, args.port, extra)
        cold["compiled_kernels"] = _compiled(cache)
        warm = one_start(args.model, cache, args.port, extra)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    report = {"cold": cold, "warm": warm, "model": args.model, "flags": extra}
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
