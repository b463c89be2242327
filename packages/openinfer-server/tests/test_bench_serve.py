"""`openinfer bench serve`: against the live test server, and against a scripted transport for
the timing, concurrency and failure rules."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import MODEL, LiveServer

from openinfer_server.bench.serve_client import (
    RequestOutcome,
    compute_metrics,
    run_requests,
    send_request,
)
from openinfer_server.cli import main

METRICS = ("ttft", "tpot", "itl", "e2el")
VLLM_KEYS = {
    "duration", "completed", "failed", "num_prompts", "request_rate", "max_concurrency",
    "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
    "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "errors",
    *(f"{stat}_{m}_ms" for m in METRICS for stat in ("mean", "median", "std", "p99")),
}
OURS = {"gpu", "commit", "command", "ceiling", "model_id", "mode"}


def _bench_serve(server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                 *flags: str) -> tuple[dict[str, Any], str]:
    path = tmp_path / "serve.json"
    code = main(["bench", "serve", "--base-url", server.url, "--num-prompts", "12",
                 "--random-input-len", "16", "--random-output-len", "5", "--ignore-eos",
                 "--max-concurrency", "3", "--result-file", str(path), *flags])
    out = capsys.readouterr().out
    assert code == 0, out
    server.wait_idle()
    return json.loads(path.read_text()), out


def _check_run(result: dict[str, Any]) -> None:
    assert set(result) >= VLLM_KEYS | OURS
    assert (result["completed"], result["failed"], result["num_prompts"]) == (12, 0, 12)
    assert result["errors"] == [""] * 12
    assert result["total_input_tokens"] == 12 * 16
    assert result["total_output_tokens"] == 12 * 5  # ignore_eos: every request runs to max
    assert result["output_lens"] == [5] * 12
    assert result["max_concurrency"] == 3
    duration = result["duration"]
    assert result["request_throughput"] == pytest.approx(12 / duration)
    assert result["output_throughput"] == pytest.approx(60 / duration)
    assert result["total_token_throughput"] == pytest.approx((60 + 192) / duration)
    for m in METRICS:
        assert 0 < result[f"median_{m}_ms"] <= result[f"p99_{m}_ms"], m
        assert result[f"mean_{m}_ms"] > 0
    assert result["mean_ttft_ms"] < result["mean_e2el_ms"]
    # A gap after every chunk but the first: at most one chunk per token (text ending inside
    # a character is held back) and one with the finish reason.
    assert all(1 <= len(gaps) <= 5 for gaps in result["itls"])
    assert result["ceiling"] is None and result["gpu"] is None  # no local GPU on CI
    assert result["model_id"] == MODEL


def test_serve_unbounded_rate(server: LiveServer, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    result, out = _bench_serve(server, tmp_path, capsys, "--request-rate", "inf")
    _check_run(result)
    assert result["request_rate"] == "inf"
    assert result["command"][:3] == ["openinfer", "bench", "serve"]
    for line in ("Serving Benchmark Result", "Successful requests:", "Maximum request "
                 "concurrency:", "Mean TTFT (ms):", "P99 ITL (ms):", "Median E2EL (ms):"):
        assert line in out, line
    assert "Request rate configured" not in out


def test_serve_poisson_rate_with_tokenizer(server: LiveServer, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           checkpoint: Path) -> None:
    result, out = _bench_serve(server, tmp_path, capsys, "--request-rate", "40", "--tokenizer",
                               str(checkpoint), "--metric-percentiles", "50,99")
    _check_run(result)
    assert result["request_rate"] == 40.0
    assert result["tokenizer_id"] == str(checkpoint)
    assert result["p50_ttft_ms"] == pytest.approx(result["median_ttft_ms"])
    assert re.search(r"^Request rate configured \(RPS\): +40.00$", out, re.MULTILINE)


def test_serve_rate_sweep(server: LiveServer, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.json"
    code = main(["bench", "serve", "--base-url", server.url, "--request-rate", "50", "inf",
                 "--num-prompts", "6", "9", "--random-input-len", "16", "--random-output-len",
                 "5", "--ignore-eos", "--metric-percentiles", "50", "--result-file", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    server.wait_idle()
    result = json.loads(path.read_text())
    # The shared fields once, then one entry per rate with what differs.
    assert set(result) >= OURS | {"request_rates", "runs", "random_input_len", "max_concurrency"}
    assert "completed" not in result and result["request_rates"] == [50.0, "inf"]
    first, second = result["runs"]
    assert (first["request_rate"], first["num_prompts"], first["seed"]) == (50.0, 6, 0)
    assert (second["request_rate"], second["num_prompts"], second["seed"]) == ("inf", 9, 1)
    for run, n in ((first, 6), (second, 9)):
        assert (run["completed"], run["failed"]) == (n, 0)
        assert run["total_input_tokens"] == n * 16 and run["output_lens"] == [5] * n
        # p99 is added for the sweep's table whatever --metric-percentiles says.
        for m in METRICS:
            assert 0 < run[f"median_{m}_ms"] <= run[f"p99_{m}_ms"], m
        assert run["p50_ttft_ms"] == pytest.approx(run["median_ttft_ms"])
    assert "Serving Benchmark Sweep" in out
    assert re.search(r"^ +50 +6/6 ", out, re.MULTILINE)
    assert re.search(r"^ +inf +9/9 ", out, re.MULTILINE)


def test_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 9 (discard) refuses connections at once.
    assert main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts",
                 "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: cannot reach the server at http://127.0.0.1:9")


def test_failed_warmup_stops_the_run(server: LiveServer,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "serve", "--base-url", server.url, "--model", "no-such-model",
                 "--num-prompts", "1", "--random-input-len", "4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: the warmup request failed: HTTP 404")


# -- the client's rules, against a scripted transport -------------------------------------
def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


TOKENS = [{"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in "abc"]
USAGE = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}


async def _send(body: bytes, status: int = 200) -> RequestOutcome:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))
    async with httpx.AsyncClient(transport=transport) as client:
        return await send_request(client, "http://bench/v1/completions",
                                  {"prompt": [1, 2, 3, 4]})


def test_a_streamed_request_is_timed_like_vllm() -> None:
    out = asyncio.run(_send(_sse(*TOKENS, USAGE)))
    assert out.success and out.error == ""
    assert (out.prompt_len, out.output_tokens, len(out.itl)) == (4, 3, 2)
    assert 0 < out.ttft <= out.latency
    assert out.latency == pytest.approx(out.ttft + sum(out.itl))


@pytest.mark.parametrize("body, status, error", [
    (b'{"error": {"message": "bad prompt"}}', 400, 'HTTP 400: {"error": {"message": "bad'),
    (_sse(TOKENS[0], {"error": {"message": "engine died"}}), 200, "error in the stream"),
    (_sse(*TOKENS), 200, "no usage chunk"),
    (_sse(USAGE), 200, "the stream ended without a token"),
])
def test_failed_requests_say_why(body: bytes, status: int, error: str) -> None:
    out = asyncio.run(_send(body, status))
    assert not out.success
    assert out.error.startswith(error), out.error


def test_max_concurrency_bounds_requests_in_flight() -> None:
    in_flight = peak = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return httpx.Response(200, content=_sse(*TOKENS, USAGE))

    async def go() -> list[RequestOutcome]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            outcomes, _ = await run_requests(
                client, "http://bench/v1/completions", [{"prompt": [1, 2]}] * 10,
                rate=float("inf"), max_concurrency=3, seed=0)
            return outcomes

    outcomes = asyncio.run(go())
    assert peak == 3
    assert all(o.success for o in outcomes)
    # Each request's start is when it got past the gate: the fourth only once one of the
    # first three had its 20 ms answer, the tenth (three waits later) at least 60 ms in.
    starts = sorted(o.start for o in outcomes)
    assert starts[0] >= 0 and starts[3] - starts[0] >= 0.02
    assert starts[-1] - starts[0] >= 0.06


def test_metrics_count_only_successes() -> None:
    ok = RequestOutcome(prompt_len=10, success=True, ttft=0.1, latency=0.5,
                        itl=[0.2, 0.2], output_tokens=3)
    one_token = RequestOutcome(prompt_len=10, success=True, ttft=0.2, latency=0.2,
                               output_tokens=1)
    failed = RequestOutcome(prompt_len=99, error="HTTP 500: boom")
    m = compute_metrics([ok, one_token, failed], duration=2.0, percentiles=(99,))
    assert (m["completed"], m["failed"]) == (2, 1)
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (20, 4)
    assert m["request_throughput"] == 1.0 and m["output_throughput"] == 2.0
    assert m["total_token_throughput"] == 12.0
    # TPOT only from requests with more than one token: (0.5 - 0.1) / 2.
    assert m["mean_tpot_ms"] == pytest.approx(200.0)
    assert m["mean_ttft_ms"] == pytest.approx(150.0)
    assert m["mean_itl_ms"] == pytest.approx(200.0)
    assert m["errors"] == ["", "", "HTTP 500: boom"]
    # Little's law over the successes: (0.5 + 0.2) s of requests in 2 s.
    assert m["mean_in_flight"] == pytest.approx(0.35)
    assert m["start_times"] == [0.0, 0.0, 0.0]



def test_serve_sends_the_sampling_flags(server: LiveServer, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    result, _ = _bench_serve(server, tmp_path, capsys, "--temperature", "0.6", "--top-p",
                             "0.95", "--top-k", "20")
    _check_run(result)


def test_sampling_fields_are_vllms() -> None:
    from openinfer_server.bench.serve_client import completion_payload, sampling_fields
    from openinfer_server.cli import build_parser

    args = build_parser().parse_args(["bench", "serve", "--top-p", "0.9", "--min-p", "0.1"])
    assert sampling_fields(args) == {"temperature": 0.0, "top_p": 0.9, "min_p": 0.1}
    default = build_parser().parse_args(["bench", "serve"])
    assert sampling_fields(default) == {"temperature": 0.0}  # greedy, as vllm bench serve
    request = type("R", (), {"prompt_token_ids": (1, 2), "output_len": 3})()
    payload = completion_payload("m", request, ignore_eos=True, sampling=sampling_fields(args))
    assert payload["top_p"] == 0.9 and payload["temperature"] == 0.0 and "top_k" not in payload
