"""`openinfer serve`: resolve the model, build the engine and the app, run uvicorn.

Imported only when serving, so `openinfer --help` and `openinfer models` stay quick."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from openinfer_core.engine.async_engine import AsyncEngine
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.errors import InvalidParameterError
from openinfer_core.plugins import get_plugin_manager
from openinfer_core.registry import Registries
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.demo import DEMO_NOTICE, DEMO_SERVED_NAME, demo_checkpoint
from openinfer_server.model_source import resolve_model

log = logging.getLogger("openinfer.server")


@dataclasses.dataclass(frozen=True, slots=True)
class ModelChoice:
    folder: Path  # what the engine loads
    served_names: list[str]
    is_demo: bool


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr,
        format="%(levelname)s %(asctime)s [%(name)s] %(message)s", datefmt="%m-%d %H:%M:%S")
    logging.getLogger("openinfer").setLevel(level.upper())
    for handler in logging.getLogger().handlers:
        handler.addFilter(_rename_uvicorn_error)


def _rename_uvicorn_error(record: logging.LogRecord) -> bool:
    # uvicorn's general logger is called "uvicorn.error"; its info lines are not errors.
    if record.name == "uvicorn.error":
        record.name = "uvicorn"
    return True


def engine_config(args: argparse.Namespace, parser: argparse.ArgumentParser,
                  registries: Registries) -> EngineConfig:
    """EngineConfig from the flags (model filled in later); a value the engine refuses is
    reported like any bad flag, with exit code 2."""
    if args.scheduler not in registries.schedulers:
        known = ", ".join(registries.schedulers.names()) or "none installed"
        parser.error(f"argument --scheduler: unknown scheduler {args.scheduler!r} "
                     f"(installed: {known})")
    if args.tensor_parallel_size != 1:
        parser.error("argument --tensor-parallel-size: only 1 is supported for now "
                     "(one GPU per server)")
    try:
        config = EngineConfig(
            model="", device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
            gpu_memory_utilization=args.gpu_memory_utilization, scheduler=args.scheduler,
            seed=args.seed, enforce_eager=args.enforce_eager, load_format=args.load_format,
            enable_prefix_caching=args.enable_prefix_caching)
        config.torch_device()
    except InvalidParameterError as exc:
        reason = str(exc).removeprefix(f"{exc.param}: ")
        parser.error(f"argument --{exc.param.replace('_', '-')}: {reason}")
    return config


def choose_model(args: argparse.Namespace, registries: Registries) -> ModelChoice:
    """The checkpoint folder to load: MODEL (local or downloaded), or the demo."""
    dummy = args.load_format == "dummy"
    if args.model is None:
        line, folder = demo_checkpoint(registries)
        log.warning("%s (model line %s, %s)", DEMO_NOTICE, line, folder)
        default_names, is_demo = [DEMO_SERVED_NAME], True
    else:
        folder = resolve_model(args.model, with_weights=not dummy, revision=args.revision,
                               download_dir=args.download_dir)
        default_names, is_demo = [args.model], False
    if dummy:
        log.warning("--load-format dummy: random weights with the checkpoint's real shapes; "
                    "outputs are meaningless (for benchmarks and smoke tests)")
    return ModelChoice(folder, list(args.served_model_name or default_names), is_demo)


class _Server(uvicorn.Server):
    """uvicorn's server, reporting the URL it listens on once its socket is bound."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[str], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._on_ready(_bound_url(self, self.config))


def _bound_url(server: uvicorn.Server, config: uvicorn.Config) -> str:
    port = config.port
    for listener in getattr(server, "servers", []):
        for sock in listener.sockets:
            port = sock.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    return f"http://{host}:{port}"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser, *,
          started: float) -> int:
    setup_logging(args.log_level)
    plugins = get_plugin_manager()
    config = engine_config(args, parser, plugins.registries)
    server: _Server | None = None
    try:
        log.info("[1/4] model: %s", args.model or "(built-in demo)")
        choice = choose_model(args, plugins.registries)
        log.info("[2/4] engine: loading weights and allocating the KV cache")
        engine = AsyncEngine(Engine(dataclasses.replace(config, model=str(choice.folder)),
                                    plugins))
        try:
            server = _build_server(args, choice, engine, started)
            if threading.current_thread() is threading.main_thread():
                # SIGTERM ends the server like Ctrl-C: uvicorn drains its connections, then
                # the engine stops and the exit code is 0.
                signal.signal(signal.SIGTERM, _interrupt)
            server.run()
        finally:
            engine.shutdown()
    except KeyboardInterrupt:
        if server is not None and server.started:
            log.info("stopped")
            return 0
        log.info("interrupted before the server was ready")
        return 130
    log.info("stopped")
    return 0


def _build_server(args: argparse.Namespace, choice: ModelChoice, engine: AsyncEngine,
                  started: float) -> _Server:
    # Imported here, not at the top: the app's modules are written beside this one.
    from openinfer_server.app import build_app

    info = engine.model_info
    log.info("KV cache capacity: %d tokens (%d blocks of %d); max model length %d tokens",
             info.kv_capacity_tokens, info.kv_total_blocks, info.kv_block_size,
             info.max_model_len)
    if args.enforce_eager:
        log.info("--enforce-eager: decode runs without CUDA graphs")
    log.info("[3/4] tokenizer: %s", choice.folder)
    tokenizer = Tokenizer.from_dir(choice.folder)
    log.info("[4/4] HTTP app: serving %s", ", ".join(repr(n) for n in choice.served_names))
    app = build_app(engine, tokenizer, served_model_names=choice.served_names,
                    api_key=args.api_key, is_demo=choice.is_demo,
                    max_model_len=info.max_model_len)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                            log_level=args.log_level, timeout_graceful_shutdown=10)

    def on_ready(url: str) -> None:
        log.info("ready in %.2f s: %s (model %s)", time.perf_counter() - started, url,
                 choice.served_names[0])

    return _Server(config, on_ready)
