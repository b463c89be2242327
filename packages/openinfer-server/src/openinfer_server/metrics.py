"""Prometheus metrics with vLLM's meanings under the `openinfer:` prefix, and one of our own:
`openinfer:request_intake_seconds`, from a request reaching the app (`ArrivalMiddleware`) to
the start of its TTFT clock (its body read and checked, its prompt tokenized), which grows
when a frontend cannot keep up with what comes in.

Each app owns its registry, so several servers in one process (tests) never share counters."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from openinfer_core.handle import EngineHandle, LoadSnapshot, supports_replica_loads
from openinfer_core.interfaces.offload import RESTORE_BUCKETS, OffloadStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                      0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


class ServerMetrics:
    """Counters and histograms fed by the request handlers (on the event loop), plus gauges
    and engine-wide counters (prefix cache, preemptions) read from `engine.load()` at scrape
    time, per replica under data parallelism."""

    def __init__(self, engine: EngineHandle, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = model_name
        model = ["model_name"]
        reg = self.registry
        self._success = Counter(
            "openinfer:request_success", "Finished requests, by finish reason.",
            [*model, "finished_reason"], registry=reg)
        self._prompt_tokens = Counter(
            "openinfer:prompt_tokens", "Prompt tokens of scheduled requests.", model,
            registry=reg)
        self._generation_tokens = Counter(
            "openinfer:generation_tokens", "Generated tokens.", model, registry=reg)
        self._ttft = Histogram(
            "openinfer:time_to_first_token_seconds", "Arrival to first generated token.",
            model, buckets=_LATENCY_BUCKETS, registry=reg)
        self._itl = Histogram(
            "openinfer:inter_token_latency_seconds", "Time between consecutive tokens.",
            model, buckets=_TOKEN_GAP_BUCKETS, registry=reg)
        self._e2e = Histogram(
            "openinfer:e2e_request_latency_seconds", "Arrival to the request's end.", model,
            buckets=_LATENCY_BUCKETS, registry=reg)
        self._intake = Histogram(
            "openinfer:request_intake_seconds", "The request reaching the app to its arrival "
            "(the start of the TTFT clock): body, checks, tokenization.", model,
            buckets=_LATENCY_BUCKETS, registry=reg)
        reg.register(_EngineLoadCollector(engine, model_name))
        # The labelled children, looked up once: `labels()` per streamed token costs ~5% of a
        # frontend's time.
        self._prompt_tokens_m = self._prompt_tokens.labels(model_name)
        self._generation_tokens_m = self._generation_tokens.labels(model_name)
        self._ttft_m = self._ttft.labels(model_name)
        self._itl_m = self._itl.labels(model_name)
        self._e2e_m = self._e2e.labels(model_name)
        self._intake_m = self._intake.labels(model_name)

    def intake(self, request: Request) -> None:
        """The time since `request` reached the app (`ArrivalMiddleware`'s stamp), observed
        as its engine requests are built; nothing without the stamp."""
        reached = getattr(request.state, ARRIVAL, None)
        if reached is not None:
            self._intake_m.observe(time.monotonic() - reached)

    def scheduled(self, prompt_tokens: int) -> None:
        self._prompt_tokens_m.inc(prompt_tokens)

    def token(self, since_previous: float | None, since_arrival: float) -> None:
        """One generated token; `since_previous` is None for the first one."""
        self._generation_tokens_m.inc()
        if since_previous is None:
            self._ttft_m.observe(since_arrival)
        else:
            self._itl_m.observe(since_previous)

    def finished(self, reason: str, e2e_seconds: float) -> None:
        self._success.labels(self._model, reason).inc()
        self._e2e_m.observe(e2e_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


ARRIVAL = "reached_app"  # the request state's key for ArrivalMiddleware's stamp


class ArrivalMiddleware:
    """Stamps each HTTP request's `state` with the monotonic time it reached the app, before
    any other middleware, its body or its route run. Plain ASGI: nothing else changes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[ARRIVAL] = time.monotonic()
        await self.app(scope, receive, send)


class _EngineLoadCollector(Collector):
    """The engine's gauges and totals. Over data-parallel replicas, one series per replica
    (label `replica`, 0..N-1); one engine keeps the `model_name` label alone."""

    def __init__(self, engine: EngineHandle, model_name: str) -> None:
        self._engine = engine
        self._model = model_name
        self._block_size = engine.model_info.kv_block_size

    def _series(self) -> tuple[list[str], list[tuple[list[str], LoadSnapshot]]]:
        """The label names, and each series' label values with its load."""
        if supports_replica_loads(self._engine):
            loads = self._engine.replica_loads()
            return (["model_name", "replica"],
                    [([self._model, str(i)], load) for i, load in enumerate(loads)])
        return ["model_name"], [([self._model], self._engine.load())]

    def collect(self) -> Iterator[Metric]:
        labels, series = self._series()
        gauges = [
            ("openinfer:num_requests_running", "Requests in the running batch.",
             lambda s: s.running),
            ("openinfer:num_requests_waiting", "Requests waiting to be scheduled.",
             lambda s: s.waiting),
            ("openinfer:kv_cache_usage_perc", "Fraction of KV blocks in use (1 = 100%).",
             lambda s: s.kv_used_blocks / s.kv_total_blocks if s.kv_total_blocks else 0.0),
        ]
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=labels)
            for values, load in series:
                family.add_metric(values, float(value(load)))
            yield family
        # Engine totals (exposed with a `_total` suffix), counted where the engine decides:
        # a preempted request looked up again on re-admission counts again, as in vLLM.
        counters = [
            ("openinfer:prefix_cache_queries", "Tokens looked up in the prefix cache.",
             lambda s: s.prefix_cache.queries),
            ("openinfer:prefix_cache_hits", "Tokens found in the prefix cache.",
             lambda s: s.prefix_cache.hits),
            ("openinfer:num_preemptions", "Preempted requests (their KV freed, recomputed "
             "later).", lambda s: s.num_preemptions),
        ]
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=labels)
            for values, load in series:
                counter.add_metric(values, float(value(load)))
            yield counter
        offloaded = [(values, load.offload) for values, load in series
                     if load.offload is not None]
        if offloaded:
            yield from self._offload(labels, offloaded)

    def _offload(self, labels: list[str],
                 series: list[tuple[list[str], OffloadStats]]) -> Iterator[Metric]:
        """Per tier (label `tier`): blocks restored from it, blocks saved to it, bytes in and
        out, blocks held, whether it turned itself off; and the restores' latency."""
        tier_labels = [*labels, "tier"]
        per_tier = [
            ("openinfer:kv_offload_hits", "KV blocks restored from the tier.", "hits"),
            ("openinfer:kv_offload_saved", "KV blocks written to the tier.", "saved"),
            ("openinfer:kv_offload_bytes_in", "Bytes written to the tier.", "bytes_in"),
            ("openinfer:kv_offload_bytes_out", "Bytes read from the tier.", "bytes_out"),
        ]
        for name, doc, attr in per_tier:
            counter = CounterMetricFamily(name, doc, labels=tier_labels)
            for values, stats in series:
                for tier in stats.tiers:
                    counter.add_metric([*values, tier.name], float(getattr(tier, attr)))
            yield counter
        used = GaugeMetricFamily("openinfer:kv_offload_used_blocks",
                                 "KV blocks the tier holds.", labels=tier_labels)
        for values, stats in series:
            for tier in stats.tiers:
                used.add_metric([*values, tier.name], float(tier.used_blocks))
        yield used
        disabled = GaugeMetricFamily("openinfer:kv_offload_tier_disabled",
                                     "1 once the tier turned itself off after an I/O error "
                                     "(a full or failing disk), else 0.", labels=tier_labels)
        for values, stats in series:
            for tier in stats.tiers:
                disabled.add_metric([*values, tier.name], float(tier.disabled))
        yield disabled
        restored = CounterMetricFamily("openinfer:kv_offload_restored_tokens",
                                       "Prompt tokens whose KV came back from a tier.",
                                       labels=labels)
        for values, stats in series:
            restored.add_metric(values, float(stats.restored_blocks * self._block_size))
        yield restored
        latency = HistogramMetricFamily("openinfer:kv_offload_restore_seconds",
                                        "From a restore's start to its KV in GPU memory.",
                                        labels=labels)
        for values, stats in series:
            latency.add_metric(values, _restore_buckets(stats), stats.restore_seconds)
        yield latency


def _restore_buckets(stats: OffloadStats) -> list[tuple[str, float]]:
    """The restores' histogram as Prometheus's cumulative buckets."""
    buckets: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip((*RESTORE_BUCKETS, float("inf")), stats.restore_buckets,
                            strict=True):
        total += count
        buckets.append((str(bound) if bound != float("inf") else "+Inf", float(total)))
    return buckets
