"""What the KV offload tiers save: restore TTFT against cold prefill and an HBM hit, and a
multi-turn run whose conversations do not fit in HBM, offload on against off.

1. Restore TTFT by prompt length. Each fresh random prompt is sent cold (nothing cached), then
   again four ways, one request at a time, one output token: an HBM hit (still in the device
   prefix cache); a host restore (the device cache flushed); a disk restore (device cache and
   host tier flushed); and cold again without offload is the baseline. Every figure checks the
   engine's `cached_tokens`. The copy floor is the prompt's KV bytes over the pinned
   host-to-device rate measured in the same run.
2. Multi-turn: C conversations in flight out of N, round robin, each turn adding U user tokens
   and O generated ones, so a conversation's prefix is evicted from HBM by the others' turns
   before it comes back. TTFT p50/p99 and output throughput, `--kv-offload host` against none.

Usage: python offload_restore.py MODEL_DIR [--lengths 1024 4096 16384 32768] [--json F]
(MODEL_DIR: a config folder; weights are made up with --load-format dummy)."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.events import Error, Finished, Rejected, Scheduled, Token
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest

ONE = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def copy_rates(nbytes: int = 1 << 30, reps: int = 5) -> dict[str, float]:
    """Pinned host <-> device copy rates (GB/s), best of `reps`."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    rates = {}
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        best = float("inf")
        for _ in range(reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        rates[name] = nbytes / best / 1e9
    return rates


def ttft(engine: Engine, request: GenerateRequest) -> tuple[float, int]:
    """Seconds to the first token of `request`, run alone; and its cached tokens."""
    start = time.perf_counter()
    engine.add_request(request)
    cached, first = -1, None
    while first is None or engine.has_work():
        for ev in engine.step():
            if ev.request_id != request.request_id:
                continue
            if isinstance(ev, Scheduled):
                cached = ev.cached_tokens
            elif isinstance(ev, Token) and first is None:
                first = time.perf_counter() - start
            elif isinstance(ev, Error | Rejected):
                raise SystemExit(f"{request.request_id}: {ev.message}")
    assert first is not None
    return first, cached


def flush_device_cache(engine: Engine) -> None:
    """Evict every cached block from HBM: take all free blocks, give them back hashless."""
    kv = engine.kv
    assert kv.num_used_blocks == 0, "flush with requests or saves in flight"
    assert kv.allocate("flush", kv.num_free_blocks * kv.block_size)
    kv.free("flush")


def restore_ttft(model: str, lengths: list[int], iters: int, disk_dir: Path,
                 host_gib: float) -> list[dict[str, Any]]:
    max_len = max(lengths) + 16
    base: dict[str, Any] = dict(model=model, load_format="dummy", max_model_len=max_len,
                                max_num_seqs=4, gpu_memory_utilization=0.85)
    rows: list[dict[str, Any]] = []
    shutil.rmtree(disk_dir, ignore_errors=True)
    engine = Engine(EngineConfig(**base, kv_offload=("host", "disk"), kv_offload_host_gib=host_gib,
                                 kv_offload_disk_dir=str(disk_dir), kv_offload_disk_gib=48.0))
    tier = engine.offload.tier  # type: ignore[union-attr]
    rng = random.Random(0)
    vocab = engine.model.vocab_size
    block_bytes = engine.model.kv_bytes_per_block(engine.kv.block_size)
    for length in lengths:
        got: dict[str, list[float]] = {"cold": [], "hbm": [], "host": [], "disk": []}
        for i in range(iters + 1):  # the first is a warm-up
            prompt = tuple(rng.randrange(1, vocab) for _ in range(length))
            times = {}
            for kind in ("cold", "hbm", "host", "disk"):
                if kind in ("host", "disk"):
                    flush_device_cache(engine)
                if kind == "disk":
                    tier.flush()
                    tier.evict_all()
                seconds, cached = ttft(engine, GenerateRequest(f"{length}-{i}-{kind}", prompt,
                                                               ONE))
                want = 0 if kind == "cold" else (length - 1) // 16 * 16
                if cached != want:
                    raise SystemExit(f"{kind} at {length}: cached {cached}, expected {want}")
                times[kind] = seconds
                tier.flush()  # saves and writes land outside the timed part
                while engine.has_work():
                    engine.step()
            if i:
                for kind, seconds in times.items():
                    got[kind].append(seconds)
        restored_bytes = (length - 1) // 16 * block_bytes
        row = {"input_len": length, "kv_bytes": restored_bytes}
        for kind, values in got.items():
            row[f"{kind}_ms_p50"] = statistics.median(values) * 1e3
            row[f"{kind}_ms"] = [v * 1e3 for v in values]
        rows.append(row)
        print(f"{length:>6} cold {row['cold_ms_p50']:8.1f}  hbm {row['hbm_ms_p50']:6.1f}  "
              f"host {row['host_ms_p50']:7.1f}  disk {row['disk_ms_p50']:7.1f} ms", flush=True)
    engine.close()
    return rows


def multi_turn(model: str, offload: bool, *, conversations: int, in_flight: int, turns: int,
               user_len: int, output_len: int, kv_blocks: int, host_gib: float
               ) -> dict[str, Any]:
    config = EngineConfig(model=model, load_format="dummy",
                          max_model_len=min(16384, (kv_blocks - 1) * 16),
                          max_num_seqs=in_flight, num_kv_blocks=kv_blocks,
                          kv_offload=("host",) if offload else (),
                          kv_offload_host_gib=host_gib)
    engine = Engine(config)
    rng = random.Random(1)
    vocab = engine.model.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    history: list[list[int]] = [[] for _ in range(conversations)]
    turn = [0] * conversations
    order = [c for _ in range(turns) for c in range(conversations)]
    active: dict[str, tuple[int, float, list[int]]] = {}
    ttfts: list[float] = []
    cached_total = prompt_total = out_tokens = 0
    start = time.perf_counter()
    nxt = 0
    busy: set[int] = set()
    while nxt < len(order) or active:
        while len(active) < in_flight and nxt < len(order) and order[nxt] not in busy:
            c = order[nxt]
            nxt += 1
            prompt = history[c] + [rng.randrange(1, vocab) for _ in range(user_len)]
            rid = f"c{c}-t{turn[c]}"
            turn[c] += 1
            busy.add(c)
            active[rid] = (c, time.perf_counter(), prompt)
            engine.add_request(GenerateRequest(rid, tuple(prompt), params))
        for ev in engine.step():
            c, t0, prompt = active[ev.request_id]
            if isinstance(ev, Scheduled):
                cached_total += ev.cached_tokens
                prompt_total += len(prompt)
            elif isinstance(ev, Token):
                out_tokens += 1
                prompt.append(ev.token_id)
                if len(prompt) == len(history[c]) + user_len + 1:
                    ttfts.append(time.perf_counter() - t0)
            elif isinstance(ev, Finished):
                history[c] = prompt
                busy.discard(c)
                del active[ev.request_id]
            elif isinstance(ev, Error | Rejected):
                raise SystemExit(f"{ev.request_id}: {ev.message}")
    elapsed = time.perf_counter() - start
    snapshot = engine.snapshot()
    engine.close()
    ttfts.sort()
    return {
        "offload": offload, "requests": len(order), "elapsed_s": elapsed,
        "output_tok_s": out_tokens / elapsed,
        "ttft_ms_p50": ttfts[len(ttfts) // 2] * 1e3,
        "ttft_ms_p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] * 1e3,
        "cached_fraction": cached_total / max(1, prompt_total),
        "final_context_tokens": sum(len(h) for h in history) // conversations,
        "kv_capacity_tokens": (kv_blocks - 1) * 16,
        "restores": snapshot.offload.restores if snapshot.offload else 0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--disk-dir", type=Path, default=Path("/tmp/openinfer-kv-disk"))
    p.add_argument("--host-gib", type=float, default=24.0)
    p.add_argument("--skip-restore", action="store_true")
    p.add_argument("--skip-multi-turn", action="store_true")
    p.add_argument("--json", type=Path)
    p.add_argument("--smoke", action="store_true",
                   help="tiny multi-turn shape, CPU allowed: checks the script, measures nothing")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if cuda else "cpu",
                              "copy_gbps": copy_rates() if cuda else {"h2d": 1.0, "d2h": 1.0}}
    print(f"pinned copies: H2D {result['copy_gbps']['h2d']:.1f} GB/s, "
          f"D2H {result['copy_gbps']['d2h']:.1f} GB/s", flush=True)
    if not args.skip_restore:
        rows = restore_ttft(args.model, args.lengths, args.iters, args.disk_dir, args.host_gib)
        for row in rows:
            row["copy_floor_ms"] = row["kv_bytes"] / (result["copy_gbps"]["h2d"] * 1e9) * 1e3
        result["restore"] = rows
    if not args.skip_multi_turn:
        shape = dict(conversations=32, in_flight=8, turns=6, user_len=768, output_len=64,
                     kv_blocks=2049, host_gib=args.host_gib)
        if args.smoke:
            shape.update(conversations=4, in_flight=2, turns=3, user_len=40, output_len=4,
                         kv_blocks=16)
        result["multi_turn_shape"] = shape
        result["multi_turn"] = [multi_turn(args.model, off, **shape) for off in (False, True)]
        for r in result["multi_turn"]:
            print(f"multi-turn offload={r['offload']}: TTFT p50 {r['ttft_ms_p50']:.1f} ms p99 "
                  f"{r['ttft_ms_p99']:.1f} ms, {r['output_tok_s']:.0f} out tok/s, cached "
                  f"{100 * r['cached_fraction']:.0f}%, {r['elapsed_s']:.1f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
