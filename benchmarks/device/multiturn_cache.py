"""Prefix-cache hits of two-turn conversations through a running server: each conversation sends
a first turn, then a second whose prompt is the first's followed by a new question, and reads
`usage.prompt_tokens_details.cached_tokens`. Under `--data-parallel-size N` a second turn hits
only if it lands on the replica that served the first; /metrics' per-replica counters show
both replicas at work.

Usage: python multiturn_cache.py [--base-url URL] [--conversations 256] [--concurrency 128]
    [--first-len 1024] [--next-len 128] [--output-len 32] [--block-size 16] [--json F]
Exit status 1 when fewer than --min-hit-fraction of the second turns reuse all the first turn's
whole blocks, or when a conversation failed: every conversation runs to its end either way, and
the failures are counted and the first few printed (how many failed, and how, tells a client's
lost keep-alive connection from a server's fault)."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ("openinfer:prefix_cache_hits_total", "openinfer:prefix_cache_queries_total")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--conversations", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=128, help="conversations at once")
    p.add_argument("--first-len", type=int, default=1024, help="first turn's prompt tokens")
    p.add_argument("--next-len", type=int, default=128, help="second turn's new tokens")
    p.add_argument("--output-len", type=int, default=32, help="max_tokens of each turn")
    p.add_argument("--block-size", type=int, default=16, help="the server's KV block size")
    p.add_argument("--min-hit-fraction", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    return p.parse_args()


def replica_counters(base_url: str) -> dict[str, dict[str, float]]:
    """COUNTERS by replica label ("" without data parallelism)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in COUNTERS:
                found.setdefault(s.labels.get("replica", ""), {})[s.name] = s.value
    return found


async def turn(client: httpx.AsyncClient, model: str, prompt: list[int],
               output_len: int) -> int:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0,
            "ignore_eos": True}
    response = await client.post("/v1/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


async def run(args: argparse.Namespace, model: str) -> list[dict[str, int] | BaseException]:
    gate = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=args.base_url, timeout=600, limits=limits) as client:

        async def conversation(i: int) -> dict[str, int]:
            rng = random.Random(args.seed * 1_000_003 + i)  # a first block no other shares
            first = [rng.randrange(1000, 30000) for _ in range(args.first_len)]
            second = first + [rng.randrange(1000, 30000) for _ in range(args.next_len)]
            async with gate:
                cached1 = await turn(client, model, first, args.output_len)
                cached2 = await turn(client, model, second, args.output_len)
            return {"first_cached": cached1, "second_cached": cached2,
                    "expected": args.first_len // args.block_size * args.block_size}

        return list(await asyncio.gather(*(conversation(i)
                                           for i in range(args.conversations)),
                                         return_exceptions=True))


def main() -> int:
    args = parse_args()
    model = httpx.get(f"{args.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    before = replica_counters(args.base_url)
    start = time.perf_counter()
    outcomes = asyncio.run(run(args, model))
    elapsed = time.perf_counter() - start
    turns = [t for t in outcomes if isinstance(t, dict)]
    failed = [t for t in outcomes if not isinstance(t, dict)]
    for error in failed[:3]:
        print(f"a conversation failed: {type(error).__name__}: {error!r}"[:300])
    if not turns:
        print(f"every conversation failed ({len(failed)})")
        return 1
    after = replica_counters(args.base_url)
    hits = sum(t["second_cached"] >= t["expected"] for t in turns)
    per_replica = {r: {name.removeprefix("openinfer:").removesuffix("_total"):
                       after[r][name] - before.get(r, {}).get(name, 0.0) for name in COUNTERS}
                   for r in sorted(after)}
    result: dict[str, Any] = {
        "conversations": len(turns), "failed": len(failed), "concurrency": args.concurrency,
        "first_len": args.first_len, "next_len": args.next_len, "output_len": args.output_len,
        "second_turns_hit": hits, "hit_fraction": hits / len(turns),
        "mean_second_cached": sum(t["second_cached"] for t in turns) / len(turns),
        "expected_cached": turns[0]["expected"],
        "first_turns_cached": sum(t["first_cached"] for t in turns),
        "per_replica": per_replica, "seconds": elapsed}
    print(f"second turns reusing the first turn's {result['expected_cached']} tokens: "
          f"{hits}/{len(turns)} ({100 * result['hit_fraction']:.1f}%), mean cached "
          f"{result['mean_second_cached']:.0f}; {len(failed)} conversations failed; "
          f"{elapsed:.1f} s")
    for replica, counts in per_replica.items():
        print(f"  replica {replica or '-'}: prefix-cache hits {counts['prefix_cache_hits']:.0f} "
              f"of {counts['prefix_cache_queries']:.0f} tokens looked up")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["hit_fraction"] >= args.min_hit_fraction and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
