"""`openinfer bench`: batch-1 latency and offline throughput of an in-process engine, and the
client side of `vllm bench serve` against a running server. Every run records the device's
ceilings beside its figures (see DESIGN.md §8).

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
    if args.bench_mode == "serve":
        from openinfer_server.bench.serve_client import run_serve

        return run_serve(args)
    if args.bench_mode == "latency":
        from openinfer_server.bench.latency import run_latency

        return run_latency(args, parser)
    from openinfer_server.bench.throughput import run_throughput

    return run_throughput(args, parser)
