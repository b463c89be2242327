"""Failure on the GPU: kill the process on one GPU (a tensor-parallel rank, or a data-parallel
replica) while streams run, and time how each stream ends.

Opens `--streams` streaming completions against the server on 127.0.0.1:8000 (long outputs,
EOS ignored), waits until every stream has produced tokens, SIGKILLs the process that
`nvidia-smi` shows on `--gpu`, then records for each stream how and when it ended: with an
error event or status, with [DONE], or cut. Then it waits for every GPU process to be gone
(`--expect-exit`: the server stops, as for a dead engine) or lists what is left.

    python3 benchmarks/device/kill_rank.py --gpu 1 --model NAME --json OUT.json"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import threading
import time
from typing import Any

LIMIT_S = 15.0  # every affected stream must end within this after the kill


def gpu_pids(gpu: int | None = None) -> list[int]:
    cmd = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
    if gpu is not None:
        cmd.insert(1, f"--id={gpu}")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split() if p.strip().isdigit()]


def stream(model: str, index: int, state: dict[str, Any]) -> None:
    body = json.dumps({"model": model, "prompt": f"stream {index}:", "max_tokens": 4000,
                       "ignore_eos": True, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", 8000, timeout=60)
    chunks, end = 0, "cut"
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            end = f"status {resp.status}"
        else:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    end = "done" if end == "cut" else end
                    break
                event = json.loads(data)
                if "error" in event:
                    end = "error: " + str(event["error"].get("message", ""))[:120]
                    continue
                chunks += 1
                state["tokens"][index] = chunks
    except Exception as exc:  # the connection dropped
        end = f"cut ({type(exc).__name__})"
    state["ends"][index] = (time.monotonic(), end, chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--json")
    args = parser.parse_args()
    state: dict[str, Any] = {"tokens": {}, "ends": {}}
    threads = [threading.Thread(target=stream, args=(args.model, i, state), daemon=True)
               for i in range(args.streams)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while len(state["tokens"]) < args.streams and time.monotonic() < deadline:
        time.sleep(0.2)
    victims = gpu_pids(args.gpu)
    killed_at = time.monotonic()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=LIMIT_S + 30)
    ends = {i: {"after_kill_s": round(at - killed_at, 2), "end": end, "chunks": n}
            for i, (at, end, n) in state["ends"].items()}
    gone_at = None
    while time.monotonic() < killed_at + 60:
        if not gpu_pids():
            gone_at = time.monotonic() - killed_at
            break
        time.sleep(0.5)
    result = {"gpu": args.gpu, "killed": victims, "streams": ends,
              "all_ended_within_limit": len(ends) == args.streams and all(
                  e["after_kill_s"] <= LIMIT_S for e in ends.values()),
              "errors": sum(e["end"].startswith(("error", "status")) for e in ends.values()),
              "gpu_processes_gone_after_s": None if gone_at is None else round(gone_at, 1),
              "left": gpu_pids()}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
