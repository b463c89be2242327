"""`openinfer serve`: resolve the model, start the engine process (or one per data-parallel
replica), run the HTTP frontend(s).

Imported only when serving, so `openinfer --help` and `openinfer models` stay quick."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openinfer_core.engine.config import EngineConfig
from openinfer_core.errors import InvalidParameterError, OpenInferError
from openinfer_core.generation_config import sampling_defaults
from openinfer_core.ipc import EngineProcess
from openinfer_core.model_config import read_model_config
from openinfer_core.plugins import get_plugin_manager
from openinfer_core.registry import Registries, import_target
from openinfer_server.demo import DEMO_NOTICE, DEMO_SERVED_NAME, demo_checkpoint
from openinfer_server.frontend import Frontend, prepare, run_frontend, supervise
from openinfer_server.model_source import resolve_model
from openinfer_server.parser_choice import check_parser_flags, choose_parsers

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
    backend = args.attention_backend
    if backend is not None and backend not in registries.attention_backends:
        known = ", ".join(registries.attention_backends.names()) or "none installed"
        parser.error(f"argument --attention-backend: unknown attention backend {backend!r} "
                     f"(installed: {known})")
    unknown = [t for t in args.kv_offload if t not in registries.offload_tiers]
    if unknown:
        known = ", ".join(registries.offload_tiers.names()) or "none installed: pip install " \
            "openinfer-offload"
        parser.error(f"argument --kv-offload: unknown tier {unknown[0]!r} (installed: {known})")
    if "disk" in args.kv_offload and not args.kv_offload_disk_dir:
        parser.error("argument --kv-offload: the disk tier needs --kv-offload-disk-dir DIR")
    if args.demo is not None and args.model is not None:
        parser.error("argument --demo: serves a built-in demo model in place of MODEL; give "
                     "one or the other")
    try:
        config = EngineConfig(
            model="", device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
            gpu_memory_utilization=args.gpu_memory_utilization, scheduler=args.scheduler,
            attention_backend=backend, seed=args.seed, enforce_eager=args.enforce_eager,
            task=args.task, load_format=args.load_format, quantization=args.quantization,
            kv_cache_dtype=args.kv_cache_dtype,
            enable_prefix_caching=args.enable_prefix_caching,
            async_scheduling=args.async_scheduling, kv_offload=args.kv_offload,
            kv_offload_host_gib=args.kv_offload_host_gib,
            kv_offload_disk_dir=args.kv_offload_disk_dir,
            kv_offload_disk_gib=args.kv_offload_disk_gib,
            tensor_parallel_size=args.tensor_parallel_size,
            data_parallel_size=args.data_parallel_size,
            enable_expert_parallel=args.enable_expert_parallel, nnodes=args.nnodes,
            node_rank=args.node_rank, master_addr=args.master_addr,
            master_port=args.master_port,
            other_processes=getattr(args, "api_server_count", 0))  # bench: no API servers
        config.check_device()
    except InvalidParameterError as exc:
        reason = str(exc).removeprefix(f"{exc.param}: ")
        parser.error(f"argument --{exc.param.replace('_', '-')}: {reason}")
    return config


def choose_model(args: argparse.Namespace, registries: Registries) -> ModelChoice:
    """The checkpoint folder to load: MODEL (local or downloaded), or the demo."""
    dummy = args.load_format == "dummy"
    if args.model is None:
        line, folder = demo_checkpoint(registries, args.demo)
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


def generation_defaults(mode: str, folder: Path) -> dict[str, Any]:
    """--generation-config's sampling defaults, logged once (not once per frontend)."""
    defaults = sampling_defaults(mode, folder)
    if defaults:
        log.warning("sampling defaults from the model's generation_config.json (the model "
                    "creator's recommendation) apply to requests that leave these fields out; "
                    "pass --generation-config vllm to use the built-in defaults instead")
        source = "model" if mode == "auto" else mode
        log.info("default sampling params from %s: %s", source, defaults)
    return defaults


def chat_encoder(registries: Registries, folder: Path) -> str | None:
    """The "module:Class" chat encoder of the model line that loads `folder` (None: the
    checkpoint's chat template renders chat prompts). Imported here, so that a broken target
    fails the start before the engine loads (PluginError)."""
    try:
        line = registries.models.match(read_model_config(folder))
    except OpenInferError:
        return None  # the engine says why it cannot load the folder
    target = line.meta.get("chat_encoder")
    if target is None:
        return None
    import_target(target)
    log.info("chat prompts: the %s model line's chat encoder (%s); a chat template in the "
             "checkpoint is not used", line.name, target)
    return str(target)


def lend_node(config: EngineConfig) -> int:
    """`--node-rank N` (N > 0): run this node's tensor-parallel ranks for node 0's engine
    until it stops them; no API here. The model, flags and weights are node 0's (its path
    must hold the checkpoint on this node too)."""
    from openinfer_core.distributed.node_agent import run_node
    from openinfer_core.distributed.nodes import NodeLayout
    from openinfer_core.distributed.tp_model import START_TIMEOUT_S

    layout = NodeLayout(config.nnodes, config.node_rank, config.master_addr, config.master_port)
    log.info("node %d of %d: waiting for node 0 at %s:%d", layout.node_rank, layout.nnodes,
             layout.master_addr, layout.master_port)
    try:
        return run_node(layout, config.torch_device(), START_TIMEOUT_S)
    except KeyboardInterrupt:
        return 130


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser, *,
          started: float) -> int:
    """Start the engine process (one per data-parallel replica), then the HTTP frontend(s) in
    front of it; returns the exit code (0 after a drained shutdown, 1 if an engine or a
    frontend died)."""
    setup_logging(args.log_level)
    plugins = get_plugin_manager()
    config = engine_config(args, parser, plugins.registries)
    if config.node_rank > 0:
        return lend_node(config)
    check_parser_flags(args, parser, plugins.registries)
    try:
        log.info("[1/4] model: %s", args.model or "(built-in demo)")
        choice = choose_model(args, plugins.registries)
        parsers = choose_parsers(args, parser, plugins.registries, choice.folder)
        frontend = Frontend(args, str(choice.folder), choice.served_names, choice.is_demo,
                            started, generation_defaults(args.generation_config, choice.folder),
                            parsers=parsers,
                            chat_encoder=chat_encoder(plugins.registries, choice.folder))
        engines = start_engines(dataclasses.replace(config, model=str(choice.folder)),
                                args.log_level, while_starting=(lambda: prepare(frontend))
                                if args.api_server_count == 1 else None)
    except KeyboardInterrupt:
        log.info("interrupted before the server was ready")
        return 130
    try:
        info = engines[0].model_info
        each = " each" if len(engines) > 1 else ""
        log.info("KV cache capacity: %d tokens (%d blocks of %d)%s; max model length %d tokens",
                 info.kv_capacity_tokens, info.kv_total_blocks, info.kv_block_size, each,
                 info.max_model_len)
        if args.enforce_eager:
            log.info("--enforce-eager: decode runs without CUDA graphs")
        if args.api_server_count == 1:
            return run_frontend(frontend, [e.addresses for e in engines],
                                sentinels=[e.sentinel for e in engines])
        return supervise(frontend, engines, args.api_server_count)
    finally:
        for engine in engines:
            engine.stop()


def start_engines(config: EngineConfig, log_level: str,
                  while_starting: Callable[[], object] | None) -> list[EngineProcess]:
    """The engine process, or one per data-parallel replica (each on its own devices)."""
    if config.data_parallel_size == 1:
        log.info("[2/4] engine process: loading weights and allocating the KV cache")
        return [EngineProcess.start(config, log_level, while_starting)]
    replicas = [config.replica(r) for r in range(config.data_parallel_size)]
    log.info("[2/4] engine processes: %d data-parallel replicas (%s) loading weights and "
             "allocating their KV caches", len(replicas),
             ", ".join(_devices(r) for r in replicas))
    engines = EngineProcess.start_many(replicas, log_level, while_starting)
    log.info("data parallel: replica engine pids %s", [e.pid for e in engines])
    return engines


def _devices(config: EngineConfig) -> str:
    """What one replica runs on: its device, or its tensor-parallel group's."""
    size = config.tensor_parallel_size
    if size == 1 or config.device == "cpu":
        return config.device
    first = int(config.device.partition(":")[2] or 0)
    return f"cuda:{first}..cuda:{first + size - 1}"
