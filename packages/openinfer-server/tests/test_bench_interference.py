"""`openinfer bench interference`: its arithmetic, and a short run against the live server."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from live_server import MODEL, LiveServer

from openinfer_server.bench.interference import (
    Sent,
    long_offsets,
    merged_windows,
    split_gaps,
)
from openinfer_server.bench.serve_client import RequestOutcome
from openinfer_server.cli import main


def _sent(at: float, ttft: float, itl: Sequence[float] = (), success: bool = True) -> Sent:
    return Sent(at, RequestOutcome(prompt_len=1, success=success, ttft=ttft,
                                   latency=ttft + sum(itl), itl=list(itl),
                                   output_tokens=len(itl) + 1))


def test_long_offsets() -> None:
    assert long_offsets(1.0, 0.25, poisson=False, seed=0) == [0.25, 0.5, 0.75]
    poisson = long_offsets(100.0, 2.0, poisson=True, seed=3)
    assert poisson == long_offsets(100.0, 2.0, poisson=True, seed=3)  # seeded
    assert poisson == sorted(poisson) and poisson[0] > 0 and poisson[-1] < 100
    assert 25 <= len(poisson) <= 75  # about 100 / 2


def test_gaps_are_split_by_the_long_prefill_windows() -> None:
    # Longs prefill over [1, 2] and [1.5, 2.5] (merged) and [4, 4.5]; a failed one counts not.
    longs = [_sent(1.0, 1.0), _sent(1.5, 1.0), _sent(4.0, 0.5), _sent(3.0, 0.1, success=False)]
    windows = merged_windows(longs)
    assert windows == [(1.0, 2.5), (4.0, 4.5)]
    # Tokens at 0.5, 1.0, 2.0, 3.0, 3.9, 4.6: gaps (0.5,1.0] touches [1, 2.5] only at its end
    # point, so it counts not; (1, 2] and (2, 3] overlap it; (3, 3.9] and (3.9, 4.6] the second.
    short = _sent(0.0, 0.5, [0.5, 1.0, 1.0, 0.9, 0.7])
    during, other = split_gaps([short], windows)
    assert during == pytest.approx([1.0, 1.0, 0.7])
    assert other == pytest.approx([0.5, 0.9])


def test_interference_against_the_live_server(server: LiveServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "interference.json"
    code = main(["bench", "interference", "--base-url", server.url, "--short-concurrency", "3",
                 "--short-input-len", "8", "--short-output-len", "4", "--long-input-len", "300",
                 "--long-interval", "0.25", "--duration", "0.8", "--label", "chunked",
                 "--result-file", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    server.wait_idle()
    result = json.loads(path.read_text())
    assert result["mode"] == "interference" and result["model_id"] == MODEL
    assert result["label"] == "chunked" and result["errors"] == []
    assert result["command"][:3] == ["openinfer", "bench", "interference"]
    assert result["duration"] >= 0.8
    short, long = result["short"], result["long"]
    # Three workers each run at least one request; ignore_eos: 4 tokens each.
    assert short["completed"] >= 3 and short["failed"] == 0
    assert short["total_output_tokens"] == 4 * short["completed"]
    assert short["num_itl"] >= 3 * short["completed"]
    assert 0 <= short["num_itl_during_long"] <= short["num_itl"]
    assert 0 < short["median_itl_ms"] <= short["p99_itl_ms"] <= short["max_itl_ms"]
    assert 0 < short["median_tpot_ms"] <= short["p99_tpot_ms"]
    assert "p99.9_itl_ms" in short
    # Long prompts at 0.25, 0.5, 0.75 s: never early, in order. Late by at most 0.5 s: the
    # client's event loop shares this process (and its GIL) with the live server's engine, so
    # on a loaded 2-core machine a send has started 0.34 s late.
    assert (long["num_sent"], long["completed"], long["failed"]) == (3, 3, 0)
    for sent, due in zip(long["send_times"], (0.25, 0.5, 0.75), strict=True):
        assert due - 0.01 <= sent <= due + 0.5
    assert long["send_times"] == sorted(long["send_times"])
    assert 0 < long["median_ttft_ms"] <= long["p99_ttft_ms"] <= long["max_ttft_ms"]
    assert "Interference Benchmark Result" in out and "Max short ITL (ms):" in out
