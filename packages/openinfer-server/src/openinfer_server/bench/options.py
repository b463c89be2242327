"""The flags of `openinfer bench latency|throughput|prefix|serve|interference`. Argparse only:
no torch here, so `openinfer bench --help` answers at once. The engine flags come from
`cli.add_engine_arguments`."""

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


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds (a number > 0), got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be > 0 and finite, got {value}")
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
    g.add_argument("--batch-size", type=int_at_least(1), default=1, metavar="N",
                   help="requests added together and run as one batch; TTFT and TPOT are "
                        "each request's (default %(default)s)")
    g.add_argument("--num-iters", type=int_at_least(1), default=10, metavar="N",
                   help="measured batches per input length (default %(default)s)")
    g.add_argument("--num-iters-warmup", type=int_at_least(0), default=2, metavar="N",
                   help="unmeasured batches first (default %(default)s)")
    _add_output_arguments(p)


def add_prefix_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prefix cache")
    g.add_argument("--input-len", type=int_at_least(1), nargs="+",
                   default=[256, 1024, 4096, 16384], metavar="N",
                   help="prompt lengths in tokens, measured one after another "
                        "(default 256 1024 4096 16384)")
    g.add_argument("--output-len", type=int_at_least(1), default=1, metavar="N",
                   help="tokens generated per request (default %(default)s)")
    g.add_argument("--num-iters", type=int_at_least(1), default=10, metavar="N",
                   help="measured cold/warm pairs per input length (default %(default)s)")
    g.add_argument("--num-iters-warmup", type=int_at_least(0), default=1, metavar="N",
                   help="unmeasured pairs first, per input length (default %(default)s)")
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


def _add_server_arguments(p: argparse.ArgumentParser) -> None:
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


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    _add_server_arguments(p)
    data = p.add_argument_group("random dataset")
    data.add_argument("--num-prompts", type=int_at_least(1), nargs="+", default=[1000],
                      metavar="N",
                      help="requests to send; with several --request-rate values, one count "
                           "for every rate or one per rate (default 1000)")
    data.add_argument("--random-input-len", type=int_at_least(1), default=1024, metavar="N",
                      help="prompt length in tokens (default %(default)s)")
    data.add_argument("--random-output-len", type=int_at_least(1), default=128, metavar="N",
                      help="max_tokens of each request (default %(default)s)")
    data.add_argument("--random-range-ratio", type=_range_ratio, default=0.0, metavar="R",
                      help="lengths uniform in [len*(1-R), len*(1+R)] (default %(default)s)")
    data.add_argument("--seed", type=int, default=0,
                      help="seeds the prompts and the arrival times (default %(default)s)")
    traffic = p.add_argument_group("traffic")
    traffic.add_argument("--request-rate", type=_request_rate, nargs="+", default=[math.inf],
                         metavar="RPS",
                         help="Poisson arrivals at this many requests per second; inf sends "
                              "all at once; several values run a sweep, one after another "
                              "(default inf)")
    traffic.add_argument("--max-concurrency", type=int_at_least(1), metavar="N",
                         help="most requests in flight at once (default: no limit)")
    traffic.add_argument("--ignore-eos", action="store_true",
                         help="generate max_tokens whatever the model says (vLLM's ignore_eos)")
    traffic.add_argument("--client-processes", type=int_at_least(0), default=0, metavar="N",
                         help="processes that send the requests, each with its share of the "
                              "arrivals and of the concurrency; one Python process parses "
                              "only ~7,000 streamed tokens/s, which a fast server outruns. "
                              "0: one per 64 concurrent requests, up to half the CPUs "
                              "(default)")
    traffic.add_argument("--metric-percentiles", type=_percentiles, default=(99.0,),
                         metavar="P,...", help="percentiles to report (default 99)")
    sampling = p.add_argument_group("sampling (as vllm bench serve: each sent when given)")
    sampling.add_argument("--temperature", type=float, default=0.0, metavar="T",
                          help="sampling temperature (default 0: greedy)")
    sampling.add_argument("--top-p", type=float, metavar="P")
    sampling.add_argument("--top-k", type=int, metavar="K")
    sampling.add_argument("--min-p", type=float, metavar="P")
    _add_output_arguments(p)


def add_interference_arguments(p: argparse.ArgumentParser) -> None:
    _add_server_arguments(p)
    short = p.add_argument_group("short requests (a closed loop)")
    short.add_argument("--short-concurrency", type=int_at_least(1), default=32, metavar="N",
                       help="short requests always in flight (default %(default)s)")
    short.add_argument("--short-input-len", type=int_at_least(1), default=128, metavar="N",
                       help="their prompt length (default %(default)s)")
    short.add_argument("--short-output-len", type=int_at_least(1), default=256, metavar="N",
                       help="their max_tokens, made whatever the model says "
                            "(default %(default)s)")
    short.add_argument("--duration", type=_positive_seconds, default=60.0, metavar="S",
                       help="seconds during which short requests are started; those in "
                            "flight then run to their end (default %(default)s)")
    long = p.add_argument_group("long prompts (arriving meanwhile)")
    long.add_argument("--long-input-len", type=int_at_least(1), default=8192, metavar="N",
                      help="their prompt length (default %(default)s)")
    long.add_argument("--long-output-len", type=int_at_least(1), default=1, metavar="N",
                      help="their max_tokens (default %(default)s)")
    long.add_argument("--long-interval", type=_positive_seconds, default=2.0, metavar="S",
                      help="seconds between long prompts, the first after one interval "
                           "(default %(default)s)")
    long.add_argument("--long-arrival", choices=("fixed", "poisson"), default="fixed",
                      help="fixed: every --long-interval; poisson: exponential gaps of that "
                           "mean (default %(default)s)")
    run = p.add_argument_group("run")
    run.add_argument("--seed", type=int, default=0,
                     help="seeds the prompts and the Poisson arrivals (default %(default)s)")
    run.add_argument("--metric-percentiles", type=_percentiles, default=(99.0, 99.9),
                     metavar="P,...", help="percentiles to report beside the mean and median "
                                           "(default 99,99.9)")
    run.add_argument("--label", help="a name for this run, kept in the results (e.g. the "
                                     "server's settings: chunked, unchunked)")
    _add_output_arguments(p)


Mode = tuple[str, str, Callable[[argparse.ArgumentParser], None]]
MODES: tuple[Mode, ...] = (
    ("latency", "latency of an in-process engine, one request or a batch at a time: TTFT, "
                "TPOT, end-to-end",
     add_latency_arguments),
    ("throughput", "offline throughput of an in-process engine: every request at once",
     add_throughput_arguments),
    ("prefix", "prefix-cache TTFT of an in-process engine: each prompt cold, then again warm",
     add_prefix_arguments),
    ("serve", "load a running server like `vllm bench serve`: TTFT, TPOT, ITL, throughput",
     add_serve_arguments),
    ("interference", "a running server: short requests' ITL while long prompts arrive",
     add_interference_arguments),
)
# The modes that build an engine in this process (and take `openinfer serve`'s engine flags).
ENGINE_MODES = frozenset({"latency", "throughput", "prefix"})
