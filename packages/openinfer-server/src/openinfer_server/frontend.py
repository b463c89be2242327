"""The HTTP frontend processes of `openinfer serve`: uvicorn + the FastAPI app, holding an
`EngineClient` to the engine process (with `--data-parallel-size N`, a `ReplicaRouter` over
one client per replica).

With one frontend (the default) it runs in the launching process. With `--api-server-count N`
the launcher binds the port once and supervises N frontend processes that share it; any of them
may take a connection, and all talk to the one engine (to every replica, each frontend through
its own router; the routers share one prefix table in shared memory, which the launcher creates
and removes, so a conversation's turns reach the same replica whichever frontend takes each).

Failure: if the engine (or one replica) dies, every open request of it ends with an error,
/health and every new generation request answer 503 with Retry-After, and the frontend stops
after `DEATH_GRACE_S` with exit code 1 (the other replicas' requests may finish while uvicorn
drains). SIGTERM or Ctrl-C stop accepting connections (a request that still reaches the app
gets a 503) and let in-flight requests finish for up to `--shutdown-timeout`; then the
responses still open end at once, a stream with an error event ("server shutting down") and
[DONE], a non-streamed request with a 503, their engine requests aborted; exit code 0."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from openinfer_core.errors import OpenInferError
from openinfer_core.handle import EngineHandle
from openinfer_core.interfaces.chat import ChatEncoderFactory
from openinfer_core.ipc import EngineAddresses, EngineClient, EngineProcess, ReplicaRouter
from openinfer_core.ipc.affinity import SharedAffinity
from openinfer_core.registry import import_target
from openinfer_server.availability import SHUTTING_DOWN, Shutdown
from openinfer_server.parser_choice import ParserChoice

if TYPE_CHECKING:  # imported when read (jinja2 and the tokenizers), beside the engine's start
    from openinfer_core.text.tokenizer import Tokenizer

log = logging.getLogger("openinfer.server")

DEATH_GRACE_S = 3.0  # after the engine died: time for error responses and a 503 /health
FINAL_WORDS_S = 2.0  # after the shutdown deadline: time for the last error events and 503s


@dataclass(frozen=True, slots=True)
class Frontend:
    """What a frontend process needs to build its app (picklable: it crosses to children)."""

    args: argparse.Namespace
    folder: str  # the checkpoint folder: tokenizer and chat template
    served_names: list[str]
    is_demo: bool
    started: float  # when `openinfer serve` started, for the ready log
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # --generation-config's
    parsers: ParserChoice = field(default_factory=ParserChoice)  # tool-call and reasoning
    chat_encoder: str | None = None  # the model line's "module:Class" chat renderer, if any


class _Server(uvicorn.Server):
    """uvicorn's server, reporting the URL it listens on once its socket is bound. Its
    shutdown refuses new requests at once and, `drain_s` later, ends the responses still
    open with a word to their clients (availability.py) rather than uvicorn's cancelling."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[str], None],
                 requests: Shutdown, drain_s: float) -> None:
        super().__init__(config)
        self._on_ready = on_ready
        self._requests = requests
        self._drain_s = drain_s

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._on_ready(_bound_url(self, self.config))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._requests.begin()
        deadline = asyncio.get_running_loop().call_later(self._drain_s, self._end_requests)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            deadline.cancel()

    def _end_requests(self) -> None:
        if self._requests.open_responses:
            log.warning("shutdown: %d response(s) still open after --shutdown-timeout %g s; "
                        "ending them with \"%s\"", self._requests.open_responses,
                        self._drain_s, SHUTTING_DOWN)
        self._requests.end()


def _bound_url(server: uvicorn.Server, config: uvicorn.Config) -> str:
    port = config.port
    for listener in getattr(server, "servers", []):
        for sock in listener.sockets:
            port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"http://{host}:{port}"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_frontend(frontend: Frontend, addresses: Sequence[EngineAddresses], *,
                 sentinels: Sequence[int] | None = None,
                 sock: socket.socket | None = None, affinity: str | None = None) -> int:
    """Serve HTTP until stopped; returns the exit code. `addresses`: the engine's, or each
    data-parallel replica's; `sentinels`: their processes', when this process started them;
    `sock`: a listening socket shared with other frontends; `affinity`: the name of the prefix
    table they share (`SharedAffinity`), with several replicas."""
    clients = _connect(addresses, sentinels)
    shared: SharedAffinity | None = None
    code = 0
    server: _Server | None = None
    try:
        engine: EngineHandle = clients[0]
        if len(clients) > 1:
            shared = None if affinity is None else SharedAffinity.attach(affinity)
            engine = ReplicaRouter(clients, None if shared is None else shared.table)
        server = _build_server(frontend, engine)

        def engine_died(message: str) -> None:
            nonlocal code
            if code == 1:
                return  # a second replica: the server is stopping already
            code = 1
            timer = threading.Timer(DEATH_GRACE_S, _stop, args=(server,))
            timer.daemon = True
            timer.start()

        for client in clients:
            client.on_death(engine_died)
        if threading.current_thread() is threading.main_thread():
            # SIGTERM ends the server like Ctrl-C: uvicorn drains its connections first.
            signal.signal(signal.SIGTERM, _interrupt)
        server.run(sockets=None if sock is None else [sock])
    except KeyboardInterrupt:
        if server is None or not server.started:
            log.info("interrupted before the server was ready")
            return 130
    finally:
        for client in clients:
            client.close()
        if shared is not None:
            shared.close()
    log.info("stopped" if code == 0 else "stopped: the engine died")
    return code


def _connect(addresses: Sequence[EngineAddresses],
             sentinels: Sequence[int] | None) -> list[EngineClient]:
    """A client per engine process; none left open if one cannot connect."""
    clients: list[EngineClient] = []
    try:
        for i, address in enumerate(addresses):
            clients.append(EngineClient(address, sentinel=None if sentinels is None
                                        else sentinels[i]))
    except BaseException:
        for client in clients:
            client.close()
        raise
    return clients


def _stop(server: uvicorn.Server) -> None:
    server.should_exit = True


_prepared: dict[str, Tokenizer] = {}  # tokenizers read by `prepare`, by folder


def prepare(frontend: Frontend) -> None:
    """What this process can do while the engine process starts: import the app's modules
    and read the tokenizer, so that the server is up as soon as the engine is. A failure here
    is left for later: the engine's own complaint about the folder (no config.json, say)
    comes first, and the tokenizer's is raised again when the server is built."""
    import openinfer_server.app  # noqa: F401

    with contextlib.suppress(OpenInferError):
        _prepared[frontend.folder] = _load_tokenizer(frontend)


def _load_tokenizer(frontend: Frontend) -> Tokenizer:
    from openinfer_core.text.tokenizer import Tokenizer

    log.info("[3/4] tokenizer: %s", frontend.folder)
    encoder = None
    if frontend.chat_encoder is not None:
        factory: ChatEncoderFactory = import_target(frontend.chat_encoder)
        encoder = factory()
    return Tokenizer.from_dir(frontend.folder, chat_encoder=encoder)


def _build_server(frontend: Frontend, engine: EngineHandle) -> _Server:
    # Imported here: the app's modules are only needed once the engine is up.
    from openinfer_core.plugins import get_plugin_manager
    from openinfer_server.app import build_app
    from openinfer_server.chat_output import ChatParsers

    args = frontend.args
    tokenizer = _prepared.pop(frontend.folder, None) or _load_tokenizer(frontend)
    log.info("[4/4] HTTP app: serving %s", ", ".join(repr(n) for n in frontend.served_names))
    app = build_app(engine, tokenizer, served_model_names=frontend.served_names,
                    api_key=args.api_key, metrics_without_auth=args.metrics_without_auth,
                    max_request_bytes=args.max_request_bytes, is_demo=frontend.is_demo,
                    max_model_len=engine.model_info.max_model_len,
                    sampling_defaults=frontend.sampling_defaults,
                    parsers=ChatParsers.from_names(get_plugin_manager().registries,
                                                   frontend.parsers.tool,
                                                   frontend.parsers.reasoning))
    # uvicorn cancels what is left FINAL_WORDS_S after our own deadline has ended it.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                            log_level=args.log_level,
                            timeout_graceful_shutdown=args.shutdown_timeout + FINAL_WORDS_S)

    def on_ready(url: str) -> None:
        log.info("ready in %.2f s: %s (model %s)", time.perf_counter() - frontend.started, url,
                 frontend.served_names[0])

    return _Server(config, on_ready, app.state.openinfer.shutdown, args.shutdown_timeout)


# -- several frontends -----------------------------------------------------------------------
def supervise(frontend: Frontend, engines: Sequence[EngineProcess], count: int) -> int:
    """Run `count` frontend processes on one port until one of them or an engine ends. With
    several replicas the frontends share one prefix table, removed here on the way out."""
    args = frontend.args
    sock = _listen(args.host, args.port)
    shared: SharedAffinity | None = None
    try:
        if len(engines) > 1 and count > 1:
            shared = SharedAffinity.create(sum(e.model_info.kv_total_blocks for e in engines))
        return _supervise(frontend, engines, count, sock,
                          None if shared is None else shared.name)
    finally:
        sock.close()
        if shared is not None:
            shared.close()


def _supervise(frontend: Frontend, engines: Sequence[EngineProcess], count: int,
               sock: socket.socket, affinity: str | None) -> int:
    args = frontend.args
    context = multiprocessing.get_context("spawn")
    addresses = [engine.addresses for engine in engines]
    children = [context.Process(target=_frontend_main, name=f"openinfer-api-{i}",
                                args=(frontend, addresses, sock, args.log_level, affinity))
                for i in range(count)]
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        for child in children:
            child.start()
        sock.close()  # each child holds its own copy now
        log.info("%d HTTP frontends on %s:%d", count, args.host, args.port)
        ready = multiprocessing.connection.wait([*(e.sentinel for e in engines),
                                                 *(c.sentinel for c in children)])
    except KeyboardInterrupt:
        _stop_children(children, args.shutdown_timeout + 5)
        return 0
    dead_engines = [e for e in engines if e.sentinel in ready]
    if dead_engines:
        log.error("the engine process died (exit code %s); frontends are failing their requests",
                  dead_engines[0].process.exitcode)
        _stop_children(children, DEATH_GRACE_S + 10, signal_first=False)
        return 1
    dead = [c for c in children if c.sentinel in ready]
    log.error("frontend %s exited with code %s: stopping the server", dead[0].name,
              dead[0].exitcode)
    _stop_children(children, args.shutdown_timeout + 5)
    return 1


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _stop_children(children: Sequence[BaseProcess], timeout: float,
                   signal_first: bool = True) -> None:
    """SIGTERM (they drain), wait up to `timeout`, then kill what is left."""
    for child in children:
        if signal_first and child.is_alive() and child.pid is not None:
            os.kill(child.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        if child.pid is not None:
            child.join(max(0.0, deadline - time.monotonic()))
    for child in children:
        if child.is_alive():
            child.kill()
            child.join(5)


def _frontend_main(frontend: Frontend, addresses: list[EngineAddresses], sock: socket.socket,
                   log_level: str, affinity: str | None) -> None:
    from openinfer_core.ipc.process import set_process_name
    from openinfer_server.serve import setup_logging

    set_process_name("openinfer-api")
    setup_logging(log_level)
    _exit_with_parent()
    sys.exit(run_frontend(frontend, addresses, sock=sock, affinity=affinity))


def _exit_with_parent() -> None:
    """A frontend never outlives the process that started it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="openinfer-parent-watch", daemon=True).start()
