"""Time from `openinfer serve` to a ready server (cold and warm Triton cache), and its idle
resident memory. Usage: python startup.py MODEL_DIR [--json PATH] [-- extra serve flags]."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


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


def one_start(model: str, cache: str, port: int, extra: list[str]) -> dict[str, float | None]:
    env = dict(os.environ, TRITON_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "openinfer_server.cli", "serve", model,
                             "--load-format", "dummy", "--port", str(port), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {proc.stderr.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        ready = time.perf_counter() - started
        time.sleep(3)  # idle
        return {"ready_s": ready, "idle_rss_mb": _rss_mb(proc.pid),
                "gpu_mb": _gpu_mb(proc.pid)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--json")
    ap.add_argument("--port", type=int, default=8123)
    args, extra = ap.parse_known_args()
    cache = tempfile.mkdtemp(prefix="triton-cache-")
    try:
        cold = one_start(args.model, cache, args.port, extra)
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
