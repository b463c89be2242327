"""The engine-core process: owns the device, runs the engine loop, talks to its frontends over
ZeroMQ. One `StepOutput` per step goes to each frontend with every event of its requests.

    while alive:
        read every message waiting (blocking only when idle)
        events = engine.step()
        send each frontend its events and the engine's load

Sockets: a PULL for what frontends send (`Hello`, `Add`, `Abort`) and a ROUTER for what the
engine sends back, addressed by each frontend's identity. The process stops on a word from its
launcher (`stop`, over the pipe that also carried `ready`) or when the launcher dies; SIGINT
and SIGTERM are left to the launcher, which drains its requests first."""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import zmq

from openinfer_core.engine.config import EngineConfig
from openinfer_core.errors import OpenInferError
from openinfer_core.events import Rejected, Token, TokenEvent, is_terminal
from openinfer_core.ipc.wire import (
    Abort,
    Add,
    FromEngine,
    StepOutput,
    ToEngine,
    Welcome,
    to_wire,
)

if TYPE_CHECKING:  # the launcher imports this module; only the engine process imports torch
    from openinfer_core.engine.engine import Engine

log = logging.getLogger("openinfer")

IDLE_POLL_MS = 500  # how often an idle engine checks that its launcher is alive


@dataclass(frozen=True, slots=True)
class EngineAddresses:
    """ZeroMQ endpoints of one engine-core process."""

    inputs: str  # PULL: frontends -> engine
    outputs: str  # ROUTER: engine -> frontends


class EngineCore:
    """The loop around an `Engine`, on the process's main thread."""

    def __init__(self, engine: Engine, addresses: EngineAddresses,
                 control: multiprocessing.connection.Connection | None = None) -> None:
        self.engine = engine
        self.control = control
        self._context = zmq.Context()
        self._inputs = self._context.socket(zmq.PULL)
        self._inputs.bind(addresses.inputs)
        self._inputs.setsockopt(zmq.RCVHWM, 0)
        self._outputs = self._context.socket(zmq.ROUTER)
        # Unbounded: at its high-water mark a ROUTER drops messages, and a dropped step would
        # lose tokens. A frontend that is gone is skipped (not ROUTER_MANDATORY).
        self._outputs.setsockopt(zmq.SNDHWM, 0)
        self._outputs.setsockopt(zmq.LINGER, 0)
        self._outputs.bind(addresses.outputs)
        self._poller = zmq.Poller()
        self._poller.register(self._inputs, zmq.POLLIN)
        if control is not None:
            self._poller.register(control.fileno(), zmq.POLLIN)
        self._decoder = msgspec.msgpack.Decoder(ToEngine)
        self._encoder = msgspec.msgpack.Encoder()
        self._owner: dict[str, bytes] = {}  # request id -> frontend
        self._frontends: list[bytes] = []
        self._parent = os.getppid()
        self._stopping = False

    def run(self) -> None:
        stats = _LoopStats()
        try:
            while not self._stopping:
                busy = self.engine.has_work()
                if not busy and self.engine.idle_work():
                    busy = True  # more idle work is left: poll for requests, do not block
                t0 = time.perf_counter()
                self._receive(0 if busy else IDLE_POLL_MS)
                t1 = time.perf_counter()
                if self.engine.has_work():
                    events = self.engine.step()
                    t2 = time.perf_counter()
                    self._send(events)
                    stats.add(t1 - t0 if busy else 0.0, t2 - t1, time.perf_counter() - t2,
                              events)
                stats.maybe_log(self.engine)
                if os.getppid() != self._parent:
                    log.error("the engine's launcher died: stopping")
                    return
        finally:
            self.engine.close()
            self._context.destroy(linger=0)

    def _receive(self, timeout_ms: int) -> None:
        """Apply every waiting message; wait up to `timeout_ms` for the first."""
        ready = dict(self._poller.poll(timeout_ms))
        if self.control is not None and self.control.fileno() in ready:
            self._stopping = True
        if self._inputs not in ready:
            return
        while True:
            try:
                frame = self._inputs.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            msg = self._decoder.decode(frame.buffer)
            if isinstance(msg, Add):
                if msg.request_id in self._owner:
                    self._send_to(msg.frontend, [Rejected(
                        msg.request_id, f"request id {msg.request_id!r} is already running")])
                    continue
                self._owner[msg.request_id] = msg.frontend
                self.engine.add_request(msg.request())
            elif isinstance(msg, Abort):
                self.engine.abort(msg.request_id)
            else:  # Hello, sent again until answered
                if msg.frontend not in self._frontends:
                    self._frontends.append(msg.frontend)
                self._send_raw(msg.frontend, Welcome(self.engine.model_info,
                                                     self.engine.snapshot()))

    def _send(self, events: list[TokenEvent]) -> None:
        by_frontend: dict[bytes, list[TokenEvent]] = defaultdict(list)
        owner = self._owner
        for event in events:
            frontend = owner.get(event.request_id)
            if frontend is None:
                continue
            if is_terminal(event):
                del owner[event.request_id]
            by_frontend[frontend].append(event)
        for frontend in self._frontends:  # the load goes to every frontend, events or not
            self._send_to(frontend, by_frontend.get(frontend, []))

    def _send_to(self, frontend: bytes, events: list[TokenEvent]) -> None:
        self._send_raw(frontend, StepOutput([to_wire(e) for e in events],
                                            self.engine.snapshot()))

    def _send_raw(self, frontend: bytes, message: FromEngine) -> None:
        self._outputs.send_multipart([frontend, self._encoder.encode(message)], copy=False)


class _LoopStats:
    """What the loop did since the last log line: logged every `LOG_EVERY_S` while busy."""

    LOG_EVERY_S = 10.0

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._since = time.perf_counter()
        self.steps = self.tokens = 0
        self.receive_s = self.step_s = self.send_s = 0.0

    def add(self, receive: float, step: float, send: float, events: list[TokenEvent]) -> None:
        self.steps += 1
        self.tokens += sum(1 for e in events if type(e) is Token)
        self.receive_s += receive
        self.step_s += step
        self.send_s += send

    def maybe_log(self, engine: Engine) -> None:
        now = time.perf_counter()
        elapsed = now - self._since
        if elapsed < self.LOG_EVERY_S:
            return
        if self.steps:
            load = engine.snapshot()
            n = self.steps
            log.info("engine: %.0f steps/s, %.0f tokens/s; per step %.1f ms in the engine, "
                     "%.2f ms sending, %.2f ms receiving; running %d, waiting %d, KV %.0f%%",
                     n / elapsed, self.tokens / elapsed, self.step_s / n * 1e3,
                     self.send_s / n * 1e3, self.receive_s / n * 1e3, load.running,
                     load.waiting, 100 * load.kv_used_blocks / max(1, load.kv_total_blocks))
        self._reset()


def run_engine_core(config: EngineConfig, addresses: EngineAddresses,
                    control: multiprocessing.connection.Connection, log_level: str,
                    log_name: str = "engine") -> None:
    """The engine-core process's entry point: build the engine, say `ready` (or why not) on
    `control`, then loop until told to stop. `log_name` tags its log lines ("engine 1" for
    data-parallel replica 1)."""
    from openinfer_core.ipc.process import set_process_name

    set_process_name("openinfer-core")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher drains first, then stops us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format=f"%(levelname)s %(asctime)s [{log_name}] %(message)s",
                        datefmt="%m-%d %H:%M:%S")
    logging.getLogger("openinfer").setLevel(log_level.upper())
    try:
        start = time.perf_counter()
        from openinfer_core.plugins import get_plugin_manager
        from openinfer_core.startup.kernel_compilers import start_compile_workers
        from openinfer_core.startup.prefetch import prefetch_checkpoint, start_device

        # A cold kernel cache: the compile workers import beside us (plugin discovery and
        # the registered compilers import no torch).
        start_compile_workers(config.device, get_plugin_manager())
        prefetch_checkpoint(config.model, config.load_format)
        start_device(config.device)  # imports torch, then the context starts beside the rest
        from openinfer_core.engine.engine import Engine

        log.info("engine modules (torch, kernels, model lines) imported in %.2f s",
                 time.perf_counter() - start)
        engine = Engine(config, defer_graphs=True)
        core = EngineCore(engine, addresses, control)
    except OpenInferError as exc:  # the user's to fix: the message says how
        control.send(("error", str(exc)))
        sys.exit(1)
    except Exception as exc:
        log.error("engine start-up failed:\n%s", traceback.format_exc())
        control.send(("error", f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    control.send(("ready", engine.model_info))
    core.run()
