"""How fast a frontend takes a burst of requests in: `--requests` streamed completions of
token-id prompts sent at once to a running server (`openinfer serve`, or
`fake_engine_server.py` for the frontend alone), then the client's TTFT and the frontend's
mean intake over the burst (`openinfer:request_intake_seconds`, from its /metrics before and
after; with several frontends each scrape is one of them). `--encode DIR` instead times the
tokenizer in DIR encoding 1, 4 and 16 KB of English text (docs/architecture.md): the work a
frontend does on its loop for a small body (`tokenizer_threads.INLINE_MAX_BYTES`).

Usage: python benchmarks/frontend_burst.py [--base-url URL] [--requests 512]
       python benchmarks/frontend_burst.py --encode TOKENIZER_DIR"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

INTAKE = "openinfer:request_intake_seconds"


def intake_totals(base_url: str) -> tuple[float, float]:
    """(sum, count) of the answering frontend's intake histogram."""
    got = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(httpx.get(f"{base_url}/metrics").text):
        for s in family.samples:
            for part in got:
                if s.name == f"{INTAKE}_{part}":
                    got[part] += s.value
    return got["sum"], got["count"]


async def first_token_s(client: httpx.AsyncClient, url: str, model: str, seed: int) -> float:
    rng = random.Random(seed)
    body = {"model": model, "prompt": [rng.randrange(1, 200) for _ in range(16)],
            "max_tokens": 2, "ignore_eos": True, "stream": True}
    started = time.perf_counter()
    first = None
    async with client.stream("POST", url, json=body) as response:
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.perf_counter() - started
    assert first is not None, "no token streamed"
    return first


async def burst(base_url: str, requests: int) -> list[float]:
    limits = httpx.Limits(max_connections=requests, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        model = (await client.get(f"{base_url}/v1/models")).json()["data"][0]["id"]
        url = f"{base_url}/v1/completions"
        await first_token_s(client, url, model, -1)  # connections and the engine warmed
        return list(await asyncio.gather(*(first_token_s(client, url, model, i)
                                           for i in range(requests))))


def encode_costs(tokenizer_dir: str) -> None:
    from openinfer_core.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    text = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    for size in (1024, 4096, 16384):
        piece = text[:size]
        started = time.perf_counter()
        for _ in range(20):
            ids = tokenizer.encode(piece, add_special_tokens=False)
        ms = (time.perf_counter() - started) / 20 * 1e3
        print(f"{size} characters: {len(ids)} tokens in {ms:.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--encode", metavar="TOKENIZER_DIR")
    args = p.parse_args()
    if args.encode:
        encode_costs(args.encode)
        return
    before = intake_totals(args.base_url)
    ttfts = sorted(asyncio.run(burst(args.base_url, args.requests)))
    after = intake_totals(args.base_url)
    count = after[1] - before[1]
    intake = (after[0] - before[0]) / count * 1e3 if count > 0 else float("nan")
    print(f"{args.requests} requests at once: TTFT p50 {statistics.median(ttfts):.2f} s, max "
          f"{ttfts[-1]:.2f} s; the frontend's mean intake {intake:.1f} ms over {count:.0f}")


if __name__ == "__main__":
    main()
