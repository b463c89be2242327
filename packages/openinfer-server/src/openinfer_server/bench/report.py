"""What a bench run hands back: a compact table on stdout (laid out like `vllm bench serve`'s)
and a JSON file. Every result names the GPU, the commit and the command, and carries the
ceilings measured in the same run."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openinfer_server.bench.stats import percentile_name

if TYPE_CHECKING:
    from openinfer_server.bench.ceiling import Ceiling

WIDTH = 50
_TITLES = [("ttft", "TTFT", "Time to First Token"),
           ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
           ("itl", "ITL", "Inter-token Latency"),
           ("e2el", "E2EL", "End-to-end Latency")]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).parent, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> tuple[str | None, bool | None]:
    """(short commit, uncommitted changes?) of the checkout this package runs from; (None,
    None) outside a git checkout, e.g. when installed from a wheel. OPENINFER_COMMIT names
    the commit where the code travelled without its .git (a lent GPU machine)."""
    if os.environ.get("OPENINFER_COMMIT"):
        return os.environ["OPENINFER_COMMIT"], False
    commit = _git("rev-parse", "--short", "HEAD")
    if not commit:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


def run_header(mode: str, ceiling: Ceiling | None, *, model: str | None,
               command: Sequence[str]) -> dict[str, Any]:
    """The fields every result file starts with."""
    commit, dirty = git_commit()
    return {
        "mode": mode, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "model_id": model, "gpu": ceiling.gpu if ceiling is not None else None,
        "commit": commit, "commit_dirty": dirty, "command": list(command),
        "ceiling": ceiling.as_dict() if ceiling is not None else None,
    }


# -- JSON -------------------------------------------------------------------------------
def result_path(result_file: str | None, result_dir: str | None, name_parts: Sequence[str],
                ) -> Path | None:
    """--result-file as given, or a generated name in --result-dir; None when neither."""
    if result_file is not None:
        return Path(result_file).expanduser()
    if result_dir is None:
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = (re.sub(r"[^\w.-]+", "_", part).strip("_") for part in name_parts)
    name = "-".join(["openinfer", *safe, stamp])
    return Path(result_dir).expanduser() / f"{name}.json"


def write_result(result: dict[str, Any], path: Path | None, *, quiet: bool = False) -> None:
    """Write `result` to `path` (nothing when None); `quiet` for the partial results a sweep
    rewrites after each step, so a run cut short still leaves what it measured."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    if not quiet:
        print(f"results written to {path}")


# -- tables -----------------------------------------------------------------------------
def title(text: str, fill: str = "=") -> str:
    return f"{text:{fill}^{WIDTH}}"


def row(label: str, value: object, fmt: str = "") -> str:
    text = "n/a" if value is None else format(value, fmt)
    return f"{label:<40} {text:<10}".rstrip()


def ceiling_rows(header: dict[str, Any]) -> list[str]:
    ceiling = header["ceiling"]
    commit = header["commit"]
    if commit is not None and header["commit_dirty"]:
        commit += " (uncommitted changes)"
    rows = [row("GPU:", header["gpu"] or "none"), row("Commit:", commit)]
    if ceiling is None:
        return [*rows, row("Ceilings:", "n/a (no local GPU)")]
    dtype = "bf16" if ceiling["dtype"] == "bfloat16" else ceiling["dtype"]
    return [*rows,
            row(f"Read bandwidth on {ceiling['device']} (GB/s):", ceiling["read_gbps"], ".1f"),
            row(f"{dtype} matmul (TFLOP/s):", ceiling["matmul_tflops"], ".1f")]


def metric_rows(result: dict[str, Any], name: str, label: str, header: str,
                percentiles: Sequence[float]) -> list[str]:
    rows = [title(header, "-"),
            row(f"Mean {label} (ms):", result[f"mean_{name}_ms"], ".2f"),
            row(f"Median {label} (ms):", result[f"median_{name}_ms"], ".2f")]
    for q in percentiles:
        p = percentile_name(q)
        rows.append(row(f"{p.upper()} {label} (ms):", result[f"{p}_{name}_ms"], ".2f"))
    return rows


def serve_table(result: dict[str, Any], percentiles: Sequence[float]) -> str:
    rows = [title(" Serving Benchmark Result "), *ceiling_rows(result),
            row("Successful requests:", result["completed"])]
    if result["failed"]:
        rows.append(row("Failed requests:", result["failed"]))
    if result["max_concurrency"] is not None:
        rows.append(row("Maximum request concurrency:", result["max_concurrency"]))
    if result["request_rate"] != "inf":
        rows.append(row("Request rate configured (RPS):", result["request_rate"], ".2f"))
    rows += [row("Benchmark duration (s):", result["duration"], ".2f"),
             row("Total input tokens:", result["total_input_tokens"]),
             row("Total generated tokens:", result["total_output_tokens"]),
             row("Request throughput (req/s):", result["request_throughput"], ".2f"),
             row("Output token throughput (tok/s):", result["output_throughput"], ".2f"),
             row("Total Token throughput (tok/s):", result["total_token_throughput"], ".2f")]
    for name, label, header in _TITLES:
        rows += metric_rows(result, name, label, header, percentiles)
    return "\n".join([*rows, "=" * WIDTH])


def latency_table(result: dict[str, Any]) -> str:
    rows = [title(" Latency Benchmark Result "), *ceiling_rows(result)]
    weight_bytes = result["weight_bytes"]
    rows.append(row("Weights read per decode step (GB):",
                    None if weight_bytes is None else weight_bytes / 1e9, ".3f"))
    rows.append(row("Decode floor (ms):", result["decode_floor_ms"], ".3f"))
    for run in result["runs"]:
        batch = run.get("batch_size", 1)
        rows.append(title(f" input {run['input_len']}, output {run['output_len']}, "
                          + (f"batch {batch}, " if batch > 1 else "")
                          + f"{run['num_iters']} iters ", "-"))
        for name, label, _ in _TITLES:
            if name == "itl":
                continue
            rows += metric_rows(run, name, label, "", [99.0])[1:]
            if name == "tpot":
                ratio = run["tpot_over_floor"]
                rows.append(row("Median TPOT / decode floor:",
                                None if ratio is None else f"{ratio:.2f}x"))
    return "\n".join([*rows, "=" * WIDTH])


def throughput_table(result: dict[str, Any]) -> str:
    rows = [title(" Throughput Benchmark Result "), *ceiling_rows(result),
            row("Requests:", result["num_requests"]),
            row("Elapsed (s):", result["elapsed_time"], ".2f"),
            row("Total input tokens:", result["total_input_tokens"]),
            row("Total output tokens:", result["total_output_tokens"]),
            row("Request throughput (req/s):", result["requests_per_second"], ".2f"),
            row("Output token throughput (tok/s):", result["output_tokens_per_second"], ".2f"),
            row("Total token throughput (tok/s):", result["tokens_per_second"], ".2f")]
    return "\n".join([*rows, "=" * WIDTH])


def prefix_table(result: dict[str, Any]) -> str:
    caching = "on" if result["enable_prefix_caching"] else "off"
    rows = [title(" Prefix Cache Benchmark Result "), *ceiling_rows(result),
            row("Prefix cache:", f"{caching}, blocks of {result['block_size']} tokens")]
    for run in result["runs"]:
        rows.append(title(f" input {run['input_len']}, output {run['output_len']}, "
                          f"{run['num_iters']} pairs ", "-"))
        for kind in ("cold", "warm"):
            name = f"{kind}_ttft"
            rows += [row(f"Mean {kind} TTFT (ms):", run[f"mean_{name}_ms"], ".2f"),
                     row(f"Median {kind} TTFT (ms):", run[f"median_{name}_ms"], ".2f"),
                     row(f"P99 {kind} TTFT (ms):", run[f"p99_{name}_ms"], ".2f")]
        rows += [row("Median cold / median warm TTFT:", f"{run['warm_speedup']:.1f}x"),
                 row("Warm prompt tokens from the cache:",
                     f"{run['cached_fraction']:.1%} (least {run['min_warm_cached_tokens']})")]
    return "\n".join([*rows, "=" * WIDTH])


SWEEP_COLUMNS = [("RPS", 6), ("ok/sent", 9), ("s", 7), ("out tok/s", 10),
                 ("TTFT p50", 9), ("p99", 9), ("TPOT p50", 9), ("p99", 8), ("ITL p50", 8),
                 ("p99", 8)]


def sweep_row(run: dict[str, Any]) -> str:
    """One rate of a `bench serve` sweep, laid out under SWEEP_COLUMNS (times in ms)."""
    rate = run["request_rate"]
    cells = [rate if rate == "inf" else f"{rate:g}", f"{run['completed']}/{run['num_prompts']}",
             f"{run['duration']:.1f}", f"{run['output_throughput']:.0f}",
             *(f"{run[f'{stat}_{name}_ms']:.2f}" for name in ("ttft", "tpot", "itl")
               for stat in ("median", "p99"))]
    return " ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, SWEEP_COLUMNS, strict=True))


def sweep_table(result: dict[str, Any]) -> str:
    rows = [title(" Serving Benchmark Sweep "), *ceiling_rows(result)]
    if result["max_concurrency"] is not None:
        rows.append(row("Maximum request concurrency:", result["max_concurrency"]))
    rows += [row("Input / output tokens:",
                 f"{result['random_input_len']} / {result['random_output_len']}"),
             title(" latencies in ms ", "-"),
             " ".join(f"{name:>{w}}" for name, w in SWEEP_COLUMNS),
             *(sweep_row(run) for run in result["runs"])]
    return "\n".join([*rows, "=" * WIDTH])


def interference_table(result: dict[str, Any], percentiles: Sequence[float]) -> str:
    short, long = result["short"], result["long"]
    rows = [title(" Interference Benchmark Result "), *ceiling_rows(result)]
    if result["label"]:
        rows.append(row("Label:", result["label"]))
    rows += [row("Benchmark duration (s):", result["duration"], ".2f"),
             row("Short requests ok / failed:", f"{short['completed']} / {short['failed']}"),
             row("Short output throughput (tok/s):", short["output_throughput"], ".2f"),
             row("Long prompts ok / failed:", f"{long['completed']} / {long['failed']}")]
    rows += metric_rows(short, "itl", "short ITL", "Short requests' inter-token latency",
                        percentiles)
    rows.append(row("Max short ITL (ms):", short["max_itl_ms"], ".2f"))
    rows += metric_rows(short, "itl_during_long", "ITL", "Short ITL while a long prefills",
                        percentiles)
    rows.append(row("Gaps overlapping a long prefill:", short["num_itl_during_long"]))
    rows += metric_rows(short, "tpot", "short TPOT", "Short requests' time per output token",
                        percentiles)
    rows += metric_rows(long, "ttft", "long TTFT", "Long prompts' time to first token",
                        percentiles)
    rows.append(row("Max long TTFT (ms):", long["max_ttft_ms"], ".2f"))
    return "\n".join([*rows, "=" * WIDTH])
