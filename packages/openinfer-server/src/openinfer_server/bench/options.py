"""The flags of `openinfer bench latency|throughput|serve`. Argparse only: no torch here, so
`openinfer bench --help` answers at once. The engine flags come from `cli.add_engine_arguments`."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable

from openinfer_server.cli import int_at_least

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


def _range_ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def _request_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be requests per second (a number > 0, or inf), got {text!r}") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {value}")
    return value


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated numbers such as 50,90,99, got {text!r}") from None
    if not all(0 < v <= 100 for v in values):
        raise argparse.ArgumentTypeError(f"each must be in (0, 100], got {text!r}")
    return values


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("results").add_mutually_exclusive_group()
    out.add_argument("--result-file", metavar="PATH", help="also write the results as JSON to PATH")
    out.add_argument("--result-dir", metavar="DIR",
                     help="also write the results as JSON into DIR, under a generated name")


def add_latency_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("latency")
    g.add_argument("--input-len", type=int_at_least(1), nargs="+", default=[128], metavar="N",
                   help="prompt length in tokens; several lengths are measured one after "
                        "another (default 128)")
    g.add_argument("--output-len", type=int_at_least(1), default=128, metavar="N",
                   help="tokens generated per request (default %(default)s)")
    g.add_argument("--num-iters", type=int_at_least(1), default=10, metavar="N",
                   help="measured requests per input length (default %(default)s)")
    g.add_argument("--num-iters-warmup", type=int_at_least(0), default=2, metavar="N",
                   help="unmeasured requests first (default %(default)s)")
    _add_output_arguments(p)


def add_throughput_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("throughput")
    g.add_argument("--num-prompts", type=int_at_least(1), default=256, metavar="N",
                   help="requests, all submitted at once (default %(default)s)")
    g.add_argument("--input-len", type=int_at_least(1), default=1024, metavar="N",
                   help="prompt length in tokens (default %(default)s)")
    g.add_argument("--output-len", type=int_at_least(1), default=128, metavar="N",
                   help="tokens generated per request (default %(default)s)")
    g.add_argument("--random-range-ratio", type=_range_ratio, default=0.0, metavar="R",
                   help="lengths uniform in [len*(1-R), len*(1+R)]; 0 keeps them fixed "
                        "(default %(default)s)")
    _add_output_arguments(p)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    server = p.add_argument_group("server")
    server.add_argument("--base-url", default=DEFAULT_BASE_URL,
                        help="the running server (default %(default)s)")
    server.add_argument("--endpoint", default="/v1/completions",
                        help="an OpenAI completions endpoint (default %(default)s)")
    server.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    server.add_argument("--tokenizer", metavar="PATH",
                        help="a tokenizer.json or the folder holding it; prompt token ids are "
                             "drawn from its vocabulary (default: ids below 32000)")
    server.add_argument("--api-key",
                        default=os.environ.get("OPENINFER_API_KEY")
                        or os.environ.get("OPENAI_API_KEY") or None,
                        help="sent as 'Authorization: Bearer KEY' (default: $OPENINFER_API_KEY, "
                             "else $OPENAI_API_KEY, else none)")
    data = p.add_argument_group("random dataset")
    data.add_argument("--num-prompts", type=int_at_least(1), default=1000, metavar="N",
                      help="requests to send (default %(default)s)")
    data.add_argument("--random-input-len", type=int_at_least(1), default=1024, metavar="N",
                      help="prompt length in tokens (default %(default)s)")
    data.add_argument("--random-output-len", type=int_at_least(1), default=128, metavar="N",
                      help="max_tokens of each request (default %(default)s)")
    data.add_argument("--random-range-ratio", type=_range_ratio, default=0.0, metavar="R",
                      help="lengths uniform in [len*(1-R), len*(1+R)] (default %(default)s)")
    data.add_argument("--seed", type=int, default=0,
                      help="seeds the prompts and the arrival times (default %(default)s)")
    traffic = p.add_argument_group("traffic")
    traffic.add_argument("--request-rate", type=_request_rate, default=math.inf, metavar="RPS",
                         help="Poisson arrivals at this many requests per second; inf sends "
                              "all at once (default %(default)s)")
    traffic.add_argument("--max-concurrency", type=int_at_least(1), metavar="N",
                         help="most requests in flight at once (default: no limit)")
    traffic.add_argument("--ignore-eos", action="store_true",
                         help="generate max_tokens whatever the model says (vLLM's ignore_eos)")
    traffic.add_argument("--metric-percentiles", type=_percentiles, default=(99.0,),
                         metavar="P,...", help="percentiles to report (default 99)")
    _add_output_arguments(p)


Mode = tuple[str, str, Callable[[argparse.ArgumentParser], None]]
MODES: tuple[Mode, ...] = (
    ("latency", "batch-1 latency of an in-process engine: TTFT, TPOT, end-to-end",
     add_latency_arguments),
    ("throughput", "offline throughput of an in-process engine: every request at once",
     add_throughput_arguments),
    ("serve", "load a running server like `vllm bench serve`: TTFT, TPOT, ITL, throughput",
     add_serve_arguments),
)
