"""How evenly a data-parallel server's replicas carry their load: polls /metrics every
`--interval` seconds for `--seconds` (or until the server stops answering, or SIGTERM) and
reports, per replica, the running and waiting requests' mean, median and maximum over the
samples where the server had any request (the mean counts the ramp-up and drain; the median is
nearer the steady state). A replica that queues while another has free slots means the router,
not the engines, sets the served throughput. The JSON also keeps every sample with its unix
time (`samples`), which `dp_timeline.py` lines up with the bench's requests, and the frontends'
own mean TTFT and end-to-end latency (arrival at a frontend to its first token / its end) and
intake (reaching the app to that arrival), `frontend`: each scrape is answered by one
frontend, so these are the mean over the last scrapes' per-frontend means, set beside the
client's in `dp_timeline.py`. They count every request since each frontend started: against
a server that ran a bench before, they mix both.

Usage: python replica_balance.py [--base-url URL] [--seconds 120] [--interval 0.5] [--json F]"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import time
from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

GAUGES = {"openinfer:num_requests_running": "running", "openinfer:num_requests_waiting": "waiting"}
# The answering frontend's histograms: (sum, count) of each
LATENCIES = {"openinfer:time_to_first_token_seconds": "ttft",
             "openinfer:e2e_request_latency_seconds": "e2e",
             "openinfer:request_intake_seconds": "intake"}
LAST_SCRAPES = 16  # the frontend means: over this many last scrapes (4 frontends: ~4 each)


def sample(client: httpx.Client, url: str
           ) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    """({(replica, running|waiting): value}, {"ttft_sum": s, "ttft_count": n, "e2e_sum": ...}
    of the answering frontend) from one scrape."""
    got: dict[tuple[str, str], float] = {}
    latency: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name in GAUGES:
                got[(s.labels.get("replica", "-"), GAUGES[s.name])] = s.value
            for name, short in LATENCIES.items():
                for part in ("sum", "count"):
                    if s.name == f"{name}_{part}":
                        latency[f"{short}_{part}"] = latency.get(f"{short}_{part}", 0) + s.value
    return got, latency


def frontend_means(scrapes: list[dict[str, float]]) -> dict[str, float]:
    """Mean TTFT and end-to-end seconds at the frontends: the mean of each scrape's own mean
    (sum / count of the frontend that answered it) over the last LAST_SCRAPES scrapes."""
    out = {}
    for short in LATENCIES.values():
        means = [s[f"{short}_sum"] / s[f"{short}_count"] for s in scrapes[-LAST_SCRAPES:]
                 if s.get(f"{short}_count")]
        if means:
            out[f"{short}_mean_s"] = sum(means) / len(means)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--json", help="write the per-replica figures here")
    args = p.parse_args()
    series: dict[tuple[str, str], list[float]] = defaultdict(list)
    samples: list[tuple[float, dict[str, float]]] = []  # (unix time, "replica what": value)
    scrapes: list[dict[str, float]] = []  # the answering frontend's latency sums and counts
    deadline = time.monotonic() + args.seconds
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline and not stopped:
            try:
                got, latency = sample(client, args.base_url)
            except httpx.HTTPError:
                break  # the server stopped
            scrapes.append(latency)
            if sum(got.values()) > 0:  # only while requests are in
                for key, value in got.items():
                    series[key].append(value)
                samples.append((time.time(), {f"{r} {what}": v for (r, what), v in got.items()}))
            time.sleep(args.interval)
    report = {f"replica {r} {what}": {"mean": sum(v) / len(v), "median": statistics.median(v),
                                      "max": max(v), "samples": len(v)}
              for (r, what), v in sorted(series.items()) if v}
    for name, figures in report.items():
        print(f"  {name}: mean {figures['mean']:.0f}, median {figures['median']:.0f}, max "
              f"{figures['max']:.0f} ({figures['samples']} samples)")
    frontend = frontend_means(scrapes)
    print("  at the frontends: " + ", ".join(f"{k} {v:.3f}" for k, v in frontend.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report | {"samples": samples, "frontend": frontend}, f, indent=1)


if __name__ == "__main__":
    main()
