"""Time from `openinfer serve` to a ready server (cold and warm Triton cache), where it went
(the engine's own start-up log: imports, weights, KV cache, CUDA graphs, warm-up), the kernel
variants a cold start compiles, and the idle resident memory of the API process and of the
engine process.

Both starts share one start-up cache folder (OPENINFER_STARTUP_CACHE_DIR, the step memory
measured by the cold start) and one Triton cache, both empty before the cold start. "timeline_s"
gives when each milestone's log line arrived, in seconds from the spawn: the engine process
started (api_spawned_engine), its imports done, engine ready, server ready, and the CUDA graphs
left for idle time all captured (graphs_done, after ready).
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

# The engine process's start-up lines (openinfer_core ipc/engine_core.py and startup/bring_up.py).
IMPORTED = re.compile(r"engine modules .* imported in ([\d.]+) s")
ENGINE_READY = re.compile(r"engine ready in ([\d.]+) s \((.*)\)")
PHASE = re.compile(r"([a-z][a-z ]*) ([\d.]+) s")
# Milestones, by the log line that marks them (engine/cuda_graphs.py, startup/, ...).
MILESTONES = {
    "api_spawned_engine": re.compile(r"\[2/4\] engine process"),
    "engine_imported": IMPORTED,
    "engine_ready": ENGINE_READY,
    "server_ready": re.compile(r"\bready in [\d.]+ s: http"),
    "graphs_done": re.compile(r"CUDA graphs: every bucket captured"),
}
NOTES = {  # what the start chose, as logged
    "compile_ahead": re.compile(r"compile ahead: (on|off)"),
    "step_memory": re.compile(r"step memory: .*\((cached|measured)\)"),
    "graphs_left_for_idle": re.compile(r"(\d+) left to capture when idle"),
    "engine_rss_after_start_mb": re.compile(r"host memory: (\d+) MB resident"),
    "engine_rss_by_phase_mb": re.compile(r"after each start-up phase, MB: (.*)$"),
}
GRAPHS_WAIT_S = 30.0  # after ready, for the graphs left for idle time, before the RSS


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _rss_by_mapping(pid: int, top: int = 12) -> dict[str, float]:
    """Resident MB of `pid` by what is mapped (a library's file name, [heap], anonymous), the
    `top` largest: where an idle engine's host memory goes."""
    sizes: dict[str, float] = {}
    name = "?"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split()
                if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                    name = Path(head[5]).name if len(head) > 5 else "[anonymous]"
                elif head and head[0] == "Rss:":
                    sizes[name] = sizes.get(name, 0.0) + int(head[1]) / 1024
    except OSError:
        return {}
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])
    return {k: round(v, 1) for k, v in largest[:top]} | {
        "(the rest)": round(sum(v for _, v in largest[top:]), 1)}


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


def _timeline(stamped: list[tuple[float, str]]) -> tuple[dict[str, float], dict[str, str]]:
    """When each milestone's line arrived (s from the spawn), and what the start chose."""
    times: dict[str, float] = {}
    notes: dict[str, str] = {}
    for at, line in stamped:
        for name, pattern in MILESTONES.items():
            if name not in times and pattern.search(line):
                times[name] = round(at, 3)
        for name, pattern in NOTES.items():
            if m := pattern.search(line):
                notes[name] = m.group(1)
    return times, notes


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


def one_start(model: str, cache: str, startup_cache: str, port: int,
              extra: list[str]) -> dict[str, object]:
    env = dict(os.environ, TRITON_CACHE_DIR=cache, OPENINFER_STARTUP_CACHE_DIR=startup_cache,
               PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "openinfer_server.cli", "serve", model,
                             "--port", str(port), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    stamped: list[tuple[float, str]] = []
    assert proc.stderr is not None
    stderr = proc.stderr

    def read() -> None:
        for line in stderr:
            stamped.append((time.perf_counter() - started, line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while True:
            if proc.poll() is not None:
                reader.join(5)
                raise RuntimeError(f"server exited: {''.join(x for _, x in stamped)[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        ready = time.perf_counter() - started
        _wait_for_graphs(stamped)
        time.sleep(3)  # idle
        engine = _children(proc.pid)  # the engine process (and multiprocessing's tracker)
        lines = [line for _, line in stamped]
        timeline, notes = _timeline(stamped)
        return {"ready_s": ready, "phases_s": _breakdown(lines), "timeline_s": timeline,
                "notes": notes, "idle_rss_mb": _rss_mb(proc.pid),
                "log": [f"{t:7.2f} {line.rstrip()}" for t, line in stamped[-150:]],
                "engine_rss_mb": sum(_rss_mb(pid) for pid in engine),
                "engine_rss_by_mapping_mb": {str(pid): _rss_by_mapping(pid) for pid in engine},
                "gpu_mb": _gpu_mb(proc.pid) or next(
                    (mb for pid in engine if (mb := _gpu_mb(pid))), None)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_for_graphs(stamped: list[tuple[float, str]]) -> None:
    """Until the graphs left for idle time are captured (or none were left)."""
    deadline = time.perf_counter() + GRAPHS_WAIT_S
    while time.perf_counter() < deadline:
        times, notes = _timeline(stamped)
        if "graphs_done" in times or notes.get("graphs_left_for_idle", "0") == "0":
            return
        time.sleep(0.1)


def _compiled(cache: str) -> dict[str, int]:
    """Kernel variants the cold start compiled, by kernel name (Triton's cache holds one
    .cubin per compiled specialization)."""
    counts: dict[str, int] = {}
    for cubin in Path(cache).rglob("*.cubin"):
        counts[cubin.stem] = counts.get(cubin.stem, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _evict(folder: str) -> None:
    """Drop `folder`'s *.safetensors from the page cache (posix_fadvise DONTNEED: no root
    needed), so the next start reads them from the disk."""
    for path in Path(folder).glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--json")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--cold-disk", action="store_true",
                    help="drop the checkpoint's shards from the page cache before each start, so "
                         "its weights are read from the disk")
    args, extra = ap.parse_known_args()
    cache = tempfile.mkdtemp(prefix="triton-cache-")
    startup_cache = tempfile.mkdtemp(prefix="openinfer-startup-")
    try:
        if args.cold_disk:
            _evict(args.model)
        cold = one_start(args.model, cache, startup_cache, args.port, extra)
        cold["compiled_kernels"] = _compiled(cache)
        if args.cold_disk:
            _evict(args.model)
        warm = one_start(args.model, cache, startup_cache, args.port, extra)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(startup_cache, ignore_errors=True)
    report = {"cold": cold, "warm": warm, "model": args.model, "flags": extra}
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
