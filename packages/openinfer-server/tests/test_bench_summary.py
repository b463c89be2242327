"""benchmarks/device/summary.py: the rows gpu_check.sh prints last, from small result files."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from device_scripts import load_device_script


@pytest.fixture(scope="module")
def summary() -> ModuleType:
    return load_device_script("summary")


def _ms(name: str, median: float, p99: float) -> dict[str, float]:
    return {f"median_{name}_ms": median, f"p99_{name}_ms": p99}


def _serve_run(rate: float | str, throughput: float) -> dict[str, Any]:
    return {"request_rate": rate, "num_prompts": 80, "completed": 80,
            "output_throughput": throughput, **_ms("ttft", 30.0, 90.0),
            **_ms("tpot", 8.0, 12.5), **_ms("itl", 7.5, 20.0)}


def test_rows_of_the_issue_5_stages(summary: ModuleType, tmp_path: Path) -> None:
    files: dict[str, Any] = {
        "prefix-qwen3-4b.json": {"runs": [
            {"input_len": n, "cached_fraction": (n - 16) / n, **_ms("cold_ttft", 40.0, 41.0),
             **_ms("warm_ttft", 9.5, 10.25)} for n in (256, 16384)]},
        "qps-qwen3-4b.json": {"request_rates": [2.0, "inf"],
                              "runs": [_serve_run(2.0, 250.0), _serve_run("inf", 4000.0)]},
        "interference-chunked.json": {
            "short": {"completed": 300, **_ms("itl", 9.0, 25.0), "max_itl_ms": 31.0,
                      **_ms("itl_during_long", 20.0, 28.0), **_ms("tpot", 10.0, 11.0)},
            "long": {"num_sent": 20, "completed": 20, **_ms("ttft", 150.0, 170.0)}},
    }
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    rows = dict(summary.lines(tmp_path))
    assert rows["prefix in 256"] == ("cold TTFT p50 40.00 p99 41.00; warm p50 9.50 p99 10.25 "
                                     "ms; 93.8% cached")
    assert rows["prefix in 16384"].endswith("ms (goal <= 20); 99.9% cached")
    assert rows["qps 2"] == ("250 out tok/s; TTFT p50 30.0 p99 90.0; TPOT p50 8.00 p99 12.50; "
                             "ITL p50 7.50 p99 20.00 ms; 80/80 ok")
    assert rows["qps inf"].startswith("4000 out tok/s")
    assert rows["interference chunked"] == (
        "short ITL p50 9.00 p99 25.00 max 31.0; during long prefill p99 28.00; TPOT p50 10.00 "
        "p99 11.00; long TTFT p50 150.0 p99 170.0 ms; 300 short, 20/20 long ok")
    assert "interference unchunked" not in rows  # no file, no row


def test_a_single_rate_result_is_one_qps_row(summary: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "qps-qwen3-4b.json").write_text(json.dumps(_serve_run(8.0, 1000.0)))
    assert [key for key, _ in summary.lines(tmp_path)] == ["qps 8"]


def test_the_import_time_ab_is_one_row(summary: ModuleType, tmp_path: Path) -> None:
    sides = {"base": {"median_s": 2.0, "samples_s": [2.0]},
             "new": {"median_s": 1.5, "samples_s": [1.5]}}
    (tmp_path / "ab-import.json").write_text(json.dumps({"runs": 1, "sides": sides}))
    assert summary.lines(tmp_path) == [
        ("A/B import time (median)", "base 2.000 s; new 1.500 s; new/base 0.750")]


def test_golden_rows_show_the_bounds_they_were_held_to(summary: ModuleType,
                                                       tmp_path: Path) -> None:
    """A gate row carries its bounds (tests/gpu/forced.py check_gate); a reference row carries
    None; a row from before the rows carried them shows the golden bounds."""
    numbers = {"regret_max": 0.3, "dlogprob_mean": 0.05, "dlogprob_p99": 0.17, "positions": 9}
    rows = [{"case": "raised", **numbers,
             "bounds": {"regret_max": 0.38, "dlogprob_mean": 0.06, "dlogprob_p99": 0.21}},
            {"case": "reference", **numbers, "bounds": None},
            {"case": "old", **numbers}]
    (tmp_path / "golden_gpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = dict(summary.lines(tmp_path))
    assert got["golden raised"] == ("regret max 0.300 (<=0.38)  |dlp| mean 0.0500 (<=0.06)  "
                                    "p99 0.170 (<=0.21)  n=9")
    rows[0]["bounds"] = {"regret_max": 0.381, "dlogprob_mean": 0.0613, "dlogprob_p99": 1e-4}
    (tmp_path / "golden_gpu.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert dict(summary.lines(tmp_path))["golden raised"] == (
        "regret max 0.300 (<=0.381)  |dlp| mean 0.0500 (<=0.0613)  p99 0.170 (<=0.0001)  n=9")
    assert got["golden reference"] == ("regret max 0.300 (reference)  |dlp| mean 0.0500 "
                                       "(reference)  p99 0.170 (reference)  n=9")
    assert got["golden old"].startswith("regret max 0.300 (<=0.2)")
