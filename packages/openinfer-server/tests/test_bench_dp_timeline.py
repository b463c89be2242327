"""benchmarks/device/dp_timeline.py: a served run's requests at the client against the
engines' samples, on the wall clock."""

from __future__ import annotations

from types import ModuleType

import pytest
from device_scripts import load_device_script


@pytest.fixture(scope="module")
def dp_timeline() -> ModuleType:
    return load_device_script("dp_timeline")


def test_the_gap_and_the_full_window(dp_timeline: ModuleType) -> None:
    """Four requests at a limit of 2, each 2 s from send to last chunk, the second pair sent
    0.6 s after the first ended: the client holds 2 in flight in seconds 0, 1, 3 and 4 (their
    middles) and none in second 2; the engines (sampled every 0.5 s) hold the same; a failed
    request counts nowhere, and a chunk's tokens follow the usage count."""
    starts = [0.0, 0.0, 2.6, 2.6, 0.0]
    run = {"duration": 5.0, "max_concurrency": 2, "output_throughput": 4.0,
           "started_at_unix": 1000.0, "start_times": starts,
           "ttfts": [0.5, 0.5, 0.5, 0.5, 0.0],
           "itls": [[0.5, 0.5, 0.5]] * 4 + [[]],
           "output_lens": [4, 4, 4, 8, 0],
           "errors": ["", "", "", "", "HTTP 500: boom"]}
    samples = []
    for i in range(10):  # the engines hold a request from 0.25 s after it was sent
        t = i * 0.5 + 0.01
        held = sum(1 for s in starts[:4] if s + 0.25 <= t < s + 2.0)
        samples.append((1000.0 + t, {"0 running": float(held), "0 waiting": 0.0}))
    r = dp_timeline.timeline(run, samples)
    rows = {row["t"]: row for row in r["seconds"]}
    assert [rows[s]["client"] for s in range(5)] == [2, 2, 0, 2, 2]
    assert [rows[s]["engines"] for s in range(5)] == [2.0, 2.0, 0.0, 2.0, 2.0]
    # Chunks at send + 0.5, 1.0, 1.5, 2.0; the 8-token request's weigh 2 each.
    assert [rows[s]["tokens"] for s in range(5)] == [2.0, 4.0, 2.0, 6.0, 6.0]
    assert r["full_seconds"] == 4
    assert r["full_output_throughput"] == pytest.approx(18.0 / 4)
    assert r["gap_mean"] == pytest.approx(0.0) and r["gap_mean_full"] == pytest.approx(0.0)
    # The four successes average TTFT 0.5 s, 2.0 s to their last chunk, 5 tokens; 4.5 tokens
    # a second at the limit of 2 make a slot's cycle 2 * 5 / 4.5 s (2.6 s in this run, its
    # last pair ending early). No frontend figures were given.
    q = r["requests"]
    assert q["client_ttft_s"] == pytest.approx(0.5)
    assert q["client_latency_s"] == pytest.approx(2.0)
    assert q["slot_cycle_s"] == pytest.approx(2 * 5 / 4.5)
    assert q["frontend_ttft_s"] is None and q["frontend_e2e_s"] is None


def test_a_gap_shows(dp_timeline: ModuleType) -> None:
    """Engines that hold fewer than the client has in flight: the difference is the gap."""
    run = {"duration": 2.0, "max_concurrency": 4, "output_throughput": 1.0,
           "started_at_unix": 50.0, "start_times": [0.0] * 4, "ttfts": [1.0] * 4,
           "itls": [[0.9]] * 4, "output_lens": [2] * 4, "errors": [""] * 4}
    samples = [(50.0 + t, {"0 running": 1.0, "1 running": 2.0, "0 waiting": 0.0})
               for t in (0.4, 1.4)]
    r = dp_timeline.timeline(run, samples, {"ttft_mean_s": 0.75, "e2e_mean_s": 1.5})
    assert r["gap_mean"] == pytest.approx(1.0) and r["gap_mean_full"] == pytest.approx(1.0)
    assert r["engines_mean"] == pytest.approx(3.0)
    assert r["requests"]["frontend_ttft_s"] == 0.75 and r["requests"]["frontend_e2e_s"] == 1.5
    assert r["requests"]["client_latency_s"] == pytest.approx(1.9)


def test_no_sample_near_a_second(dp_timeline: ModuleType) -> None:
    run = {"duration": 1.0, "max_concurrency": 1, "output_throughput": 1.0,
           "started_at_unix": 0.0, "start_times": [0.0], "ttfts": [0.5], "itls": [[]],
           "output_lens": [1], "errors": [""]}
    r = dp_timeline.timeline(run, [(10.0, {"0 running": 1.0})])
    assert r["seconds"][0]["engines"] is None and r["gap_mean"] is None


def test_the_frontends_means() -> None:
    """Each scrape's own mean (one frontend's sum / count), averaged over the last scrapes;
    a scrape before any request (count 0) is left out."""
    balance = load_device_script("replica_balance")
    scrapes = [{"ttft_sum": 0.0, "ttft_count": 0.0},
               {"ttft_sum": 2.0, "ttft_count": 10.0, "e2e_sum": 40.0, "e2e_count": 10.0},
               {"ttft_sum": 6.0, "ttft_count": 20.0, "e2e_sum": 100.0, "e2e_count": 20.0}]
    means = balance.frontend_means(scrapes)
    assert means["ttft_mean_s"] == pytest.approx((0.2 + 0.3) / 2)
    assert means["e2e_mean_s"] == pytest.approx((4.0 + 5.0) / 2)
    assert balance.frontend_means([{}]) == {}
