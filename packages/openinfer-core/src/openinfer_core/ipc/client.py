"""`EngineClient`: the `EngineHandle` a frontend holds when the engine runs in its own process.

Requests go out on a PUSH socket (any thread, under a lock); a reader thread owns the DEALER
socket the engine answers on, turns each `StepOutput` back into events and hands them to the
asyncio tasks waiting for them, one wake-up per event loop per step. The same thread watches
for the engine's death (its socket disconnecting, or its process ending when this process
started it): every open request then ends with `Error`, and so does every new one."""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

from openinfer_core.engine.streams import EventStreams
from openinfer_core.errors import InvalidParameterError, OpenInferError
from openinfer_core.events import TokenEvent
from openinfer_core.handle import LoadSnapshot, ModelInfo
from openinfer_core.ipc.engine_core import EngineAddresses
from openinfer_core.ipc.wire import (
    Abort,
    Add,
    FromEngine,
    Hello,
    StepOutput,
    ToEngine,
    Welcome,
    from_wire,
)
from openinfer_core.request import GenerateRequest

log = logging.getLogger("openinfer")

ENGINE_DIED = "the engine process died"


class EngineClient:
    """Implements `openinfer_core.handle.EngineHandle` over ZeroMQ. `sentinel`: the engine
    process's `multiprocessing` sentinel, when this process started it."""

    def __init__(self, addresses: EngineAddresses, *, sentinel: int | None = None,
                 connect_timeout: float = 60.0) -> None:
        self.identity = f"frontend-{os.getpid()}-{uuid.uuid4().hex[:8]}".encode()
        self._context = zmq.Context()
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(addresses.inputs)
        self._dealer = self._context.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.IDENTITY, self.identity)
        self._dealer.setsockopt(zmq.RCVHWM, 0)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._monitor = self._dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._dealer.connect(addresses.outputs)
        self._sentinel = sentinel
        self._send_lock = threading.Lock()
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(FromEngine)
        self._streams = EventStreams()
        self._on_death: list[Callable[[str], None]] = []
        self._closing = False
        welcome = self._handshake(connect_timeout)
        self._model_info = welcome.model_info
        self._load = welcome.load
        self._reader = threading.Thread(target=self._read, name="openinfer-engine-client",
                                        daemon=True)
        self._reader.start()

    # -- EngineHandle ----------------------------------------------------------------------
    @property
    def model_info(self) -> ModelInfo:
        return self._model_info

    @property
    def dead(self) -> str | None:
        return self._streams.dead

    def load(self) -> LoadSnapshot:
        return self._load

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        return self._streams.run(request, self._submit, self.abort)

    def abort(self, request_id: str) -> None:
        if self.dead is None:
            self._send(Abort(request_id))

    # -- what a router over replicas asks ------------------------------------------------
    def holds(self, request_id: str) -> bool:
        """Whether `request_id` was sent through this client and has not ended."""
        return self._streams.holds(request_id)

    # -- lifecycle -------------------------------------------------------------------------
    def on_death(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)` (on the reader thread) if the engine dies."""
        self._on_death.append(callback)

    def close(self) -> None:
        """Stop reading; open requests end with an error. The engine itself is not stopped."""
        self._closing = True
        self._reader.join(timeout=5)
        self._streams.fail_all("the server is shutting down")
        self._context.destroy(linger=0)

    # -- internals -------------------------------------------------------------------------
    def _submit(self, request: GenerateRequest) -> None:
        self._send(Add.of(self.identity, request))

    def _send(self, message: ToEngine) -> None:
        try:
            data = self._encoder.encode(message)
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as exc:
            # The server checks every field first; this keeps a value it missed the
            # client's mistake (a 400), not a crash of the request.
            raise InvalidParameterError(
                _unsendable_field(message), f"cannot be sent to the engine: {exc}") from exc
        with self._send_lock:
            self._push.send(data, copy=False)

    def _handshake(self, timeout: float) -> Welcome:
        """Say Hello until the engine answers: its answer can only reach this socket once the
        engine has seen the connection, so an early answer could be lost."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._send(Hello(self.identity))
            if self._dealer.poll(100):
                msg = self._decoder.decode(self._dealer.recv())
                if isinstance(msg, Welcome):
                    return msg
            if self._sentinel is not None and _readable(self._sentinel):
                break
        self._context.destroy(linger=0)
        raise OpenInferError(f"the engine process did not answer within {timeout:.0f} s")

    def _read(self) -> None:
        poller = zmq.Poller()
        poller.register(self._dealer, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        if self._sentinel is not None:
            poller.register(self._sentinel, zmq.POLLIN)
        try:
            while not self._closing:
                ready = dict(poller.poll(200))
                if self._dealer in ready:
                    self._drain()
                if self._monitor in ready and self._disconnected():
                    return self._die(ENGINE_DIED)
                if self._sentinel is not None and self._sentinel in ready:
                    return self._die(ENGINE_DIED)
        except Exception as exc:  # a bug here must not leave requests hanging
            if not self._closing:
                log.exception("engine client reader failed")
                self._die(f"engine client failed: {exc!r}")

    def _drain(self) -> None:
        while True:
            try:
                frame = self._dealer.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            msg = self._decoder.decode(frame.buffer)
            if isinstance(msg, StepOutput):
                self._load = msg.load
                if msg.events:
                    self._streams.deliver([from_wire(e) for e in msg.events])

    def _disconnected(self) -> bool:
        event = recv_monitor_message(self._monitor)
        return bool(event["event"] == zmq.EVENT_DISCONNECTED)

    def _die(self, message: str) -> None:
        if self._streams.dead is not None:
            return
        log.error("%s: failing every open request", message)
        self._streams.fail_all(message)
        for callback in self._on_death:
            callback(message)


def _unsendable_field(message: ToEngine) -> str:
    """The first field of `message` holding an integer msgpack cannot carry, or "request"."""
    fields: list[tuple[str, object]] = []
    if isinstance(message, Add):
        fields = [("prompt", message.prompt_token_ids), ("priority", message.priority)]
        fields += [(f.name, getattr(message.params, f.name))
                   for f in dataclasses.fields(message.params)]
    for name, value in fields:
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, int) and not _INT_MIN <= v <= _UINT_MAX for v in values):
            return name
    return "request"


_INT_MIN, _UINT_MAX = -(2**63), 2**64 - 1  # msgpack's integers


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])
