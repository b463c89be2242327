"""One engine process killed under load: every request it held must end with an error within
15 s, the others must finish, and nothing may hang.

Starts --streams streamed completions (ignore_eos, --output-len tokens), waits until each has
a token, SIGKILLs --pid (an engine replica; `openinfer serve` logs "replica engine pids
[...]"), then follows every stream to its end. Usage: python replica_kill.py --pid PID
[--base-url URL] [--streams 64] [--output-len 500] [--json F]. Exit status 1 when an affected
request ended later than 15 s after the kill, or a stream neither finished nor failed (the
others are cut off if they outlast the server's --shutdown-timeout)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import httpx

LIMIT_S = 15.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pid", type=int, required=True, help="the engine process to kill")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--output-len", type=int, default=500,
                   help="tokens per stream: few enough that the live replica's streams finish "
                        "while the server drains")
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


async def stream(client: httpx.AsyncClient, model: str, i: int, output_len: int,
                 started: asyncio.Event, killed: list[float]) -> dict[str, Any]:
    """How stream `i` ended: error (with its message), a finish reason, none (the stream
    closed without either) or cut (the connection broke)."""
    body = {"model": model, "prompt": f"Stream {i}: tell a long story.", "stream": True,
            "max_tokens": output_len, "temperature": 0, "ignore_eos": True}
    end: dict[str, Any] = {"stream": i, "end": "none"}
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                started.set()
                data = json.loads(line.removeprefix("data: "))
                if "error" in data:
                    end = {"stream": i, "end": "error", "message": data["error"]["message"]}
                elif data["choices"] and data["choices"][0].get("finish_reason"):
                    end = {"stream": i, "end": data["choices"][0]["finish_reason"]}
    except httpx.HTTPError as exc:
        end = {"stream": i, "end": "cut", "message": repr(exc)}
    if killed:
        end["after_kill_s"] = time.monotonic() - killed[0]
    return end


async def run(args: argparse.Namespace, model: str) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=args.streams)
    killed: list[float] = []
    async with httpx.AsyncClient(base_url=args.base_url, timeout=120, limits=limits) as client:
        events = [asyncio.Event() for _ in range(args.streams)]
        tasks = [asyncio.create_task(stream(client, model, i, args.output_len, events[i], killed))
                 for i in range(args.streams)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)
        os.kill(args.pid, signal.SIGKILL)
        killed.append(time.monotonic())
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 300))


def main() -> int:
    args = parse_args()
    model = httpx.get(f"{args.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    ends = asyncio.run(run(args, model))
    failed = [e for e in ends if e["end"] == "error"]
    finished = [e for e in ends if e["end"] not in ("error", "none", "cut")]
    late = [e for e in failed if e["after_kill_s"] > LIMIT_S]
    hung = [e for e in ends if e["end"] in ("none", "cut")]
    slowest = max((e["after_kill_s"] for e in failed), default=0.0)
    print(f"{len(failed)} streams failed (the slowest {slowest:.2f} s after the kill), "
          f"{len(finished)} finished, {len(hung)} ended without either; "
          f"{len(late)} failed later than {LIMIT_S:.0f} s")
    if failed:
        print(f"  error: {failed[0]['message']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ends": ends, "failed": len(failed), "finished": len(finished),
                       "slowest_failure_s": slowest}, f, indent=1)
    return 0 if failed and not late and not hung else 1


if __name__ == "__main__":
    sys.exit(main())
