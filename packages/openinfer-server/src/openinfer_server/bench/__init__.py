"""`openinfer bench`: batch-1 latency, offline throughput and prefix-cache TTFT of an in-process
engine; the client side of `vllm bench serve` (one rate or a sweep) and a chunked-prefill
interference test against a running server. Every run records the device's ceilings beside
its figures (see DESIGN.md §8).

Light on purpose: the modes import the engine (and torch) only when they run."""

from __future__ import annotations

import argparse
import sys

from openinfer_core.errors import OpenInferError


class BenchError(OpenInferError):
    """A benchmark cannot run as asked (lengths past the model, a server that fails...)."""


def run_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the mode `args.bench_mode`; `parser` is that mode's, for usage errors. `args.argv`,
    the command line recorded in results, is set by `cli.main` (else taken from sys.argv)."""
    if not hasattr(args, "argv"):
        args.argv = ["openinfer", *sys.argv[1:]]
    mode = args.bench_mode
    if mode == "serve":
        from openinfer_server.bench.serve_client import run_serve

        return run_serve(args, parser)
    if mode == "interference":
        from openinfer_server.bench.interference import run_interference

        return run_interference(args, parser)
    if mode == "latency":
        from openinfer_server.bench.latency import run_latency

        return run_latency(args, parser)
    if mode == "prefix":
        from openinfer_server.bench.prefix import run_prefix

        return run_prefix(args, parser)
    from openinfer_server.bench.throughput import run_throughput

    return run_throughput(args, parser)
