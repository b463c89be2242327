"""Where a served run's requests were, second by second: in flight at the client (`openinfer
bench serve`'s result, its `start_times`, TTFTs and token gaps) against inside the engines
(running + waiting, `replica_balance.py`'s samples), lined up on the wall clock. The
difference is the requests that the client counts in flight and no engine holds: on their way
in (HTTP, the frontend, routing) or out (the last token to the client, the next request). It
reports that gap and the output throughput over the whole run, and over the window where the
client held all of `--max-concurrency` in flight (the run without its ramp-up and drain). A
request's time is then split: its mean TTFT and latency at the client against the frontends'
own (`replica_balance.py`'s `frontend`: the difference is the way in and out over HTTP, and
the frontends' intake, from a request reaching the app to the start of their clock), and a
slot's cycle at the limit (limit / requests finished per second) against the client's latency
(the difference: from a request's last chunk to its successor's sending).

Usage: python dp_timeline.py BENCH_RESULT.json REPLICA_BALANCE.json [--json F]"""

from __future__ import annotations

import argparse
import bisect
import json
from typing import Any

FULL = 0.98  # a second counts as "full" when the client had this share of its limit in flight


def token_times(run: dict[str, Any]) -> list[tuple[float, float]]:
    """(seconds from the run's start, tokens) of every streamed chunk of a successful request,
    each chunk weighted so a request's chunks add up to its counted output tokens."""
    out = []
    for start, ttft, gaps, tokens, error in zip(run["start_times"], run["ttfts"], run["itls"],
                                                run["output_lens"], run["errors"], strict=True):
        if error or not tokens:
            continue
        t = start + ttft
        weight = tokens / (1 + len(gaps))
        out.append((t, weight))
        for gap in gaps:
            t += gap
            out.append((t, weight))
    return out


def client_in_flight(run: dict[str, Any], at: float) -> int:
    """Successful requests sent and not yet at their last chunk at `at` (seconds)."""
    return sum(1 for start, ttft, gaps, error in zip(run["start_times"], run["ttfts"],
                                                     run["itls"], run["errors"], strict=True)
               if not error and start <= at < start + ttft + sum(gaps))


def engine_load(samples: list[tuple[float, dict[str, float]]], times: list[float],
                at_unix: float) -> float | None:
    """Running + waiting over every replica in the sample nearest `at_unix` (`times`: the
    samples' times, in order), or None where no sample is within a second."""
    i = bisect.bisect_left(times, at_unix)
    near = [j for j in (i - 1, i) if 0 <= j < len(samples)]
    if not near:
        return None
    j = min(near, key=lambda k: abs(times[k] - at_unix))
    if abs(times[j] - at_unix) > 1.0:
        return None
    return sum(samples[j][1].values())


def request_split(run: dict[str, Any], full_throughput: float | None,
                  frontend: dict[str, float]) -> dict[str, float | None]:
    """Mean seconds of a successful request: TTFT and latency (to its last chunk) at the client
    and at the frontends, and a slot's cycle at the limit (None without a full second)."""
    ok = [(ttft, ttft + sum(gaps), tokens) for ttft, gaps, tokens, error
          in zip(run["ttfts"], run["itls"], run["output_lens"], run["errors"], strict=True)
          if not error and tokens]
    if not ok:
        return {}
    tokens = sum(t for _, _, t in ok) / len(ok)
    return {"client_ttft_s": sum(t for t, _, _ in ok) / len(ok),
            "client_latency_s": sum(e for _, e, _ in ok) / len(ok),
            "frontend_intake_s": frontend.get("intake_mean_s"),
            "frontend_ttft_s": frontend.get("ttft_mean_s"),
            "frontend_e2e_s": frontend.get("e2e_mean_s"),
            "slot_cycle_s": (run["max_concurrency"] * tokens / full_throughput
                             if full_throughput else None)}


def timeline(run: dict[str, Any], samples: list[tuple[float, dict[str, float]]],
             frontend: dict[str, float] | None = None) -> dict[str, Any]:
    duration, limit = run["duration"], run["max_concurrency"]
    started = run["started_at_unix"]
    tokens = sorted(token_times(run))
    times = [t for t, _ in samples]
    seconds = []
    for s in range(int(duration)):
        mid = s + 0.5
        flight = client_in_flight(run, mid)
        engines = engine_load(samples, times, started + mid)
        made = sum(w for t, w in tokens[bisect.bisect_left(tokens, (s, -1.0)):
                                         bisect.bisect_left(tokens, (s + 1, -1.0))])
        seconds.append({"t": s, "client": flight, "engines": engines, "tokens": made})
    full = [r for r in seconds if r["client"] >= FULL * limit]
    paired = [r for r in seconds if r["engines"] is not None]
    paired_full = [r for r in full if r["engines"] is not None]

    def mean(rows: list[dict[str, Any]], key: str) -> float | None:
        return sum(r[key] for r in rows) / len(rows) if rows else None

    return {
        "duration_s": duration, "max_concurrency": limit,
        "output_throughput": run["output_throughput"],
        "full_seconds": len(full),
        "full_output_throughput": mean(full, "tokens"),
        "client_in_flight_mean": mean(seconds, "client"),
        "engines_mean": mean(paired, "engines"),
        "gap_mean": (mean(paired, "client") - mean(paired, "engines")) if paired else None,
        "gap_mean_full": ((mean(paired_full, "client") - mean(paired_full, "engines"))
                          if paired_full else None),
        "requests": request_split(run, mean(full, "tokens"), frontend or {}),
        "seconds": seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench")
    p.add_argument("balance")
    p.add_argument("--json", help="write the timeline here")
    args = p.parse_args()
    with open(args.bench) as f:
        run = json.load(f)
    with open(args.balance) as f:
        balance = json.load(f)
    samples = [(t, values) for t, values in balance.get("samples", [])]
    r = timeline(run, sorted(samples, key=lambda s: s[0]), balance.get("frontend"))

    def fmt(v: float | None, spec: str = ".0f") -> str:
        return "n/a" if v is None else format(v, spec)

    print(f"{r['duration_s']:.1f} s, limit {r['max_concurrency']}: output "
          f"{r['output_throughput']:.0f} tok/s over the run, "
          f"{fmt(r['full_output_throughput'])} over the {r['full_seconds']} s at the limit; "
          f"in flight at the client {fmt(r['client_in_flight_mean'])}, in the engines "
          f"{fmt(r['engines_mean'])}: a gap of {fmt(r['gap_mean'])} ({fmt(r['gap_mean_full'])} "
          f"at the limit)")
    q = r["requests"]
    if q:
        print(f"  a request, mean s: TTFT client {fmt(q['client_ttft_s'], '.3f')} / frontends "
              f"{fmt(q['frontend_ttft_s'], '.3f')} after an intake of "
              f"{fmt(q['frontend_intake_s'], '.3f')}; to its end client "
              f"{fmt(q['client_latency_s'], '.3f')} / frontends "
              f"{fmt(q['frontend_e2e_s'], '.3f')}; a slot's cycle at the limit "
              f"{fmt(q['slot_cycle_s'], '.3f')}")
    for row in r["seconds"]:
        print(f"  {row['t']:4d} s  client {row['client']:5d}  engines "
              f"{fmt(row['engines']):>5}  tokens {row['tokens']:8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
