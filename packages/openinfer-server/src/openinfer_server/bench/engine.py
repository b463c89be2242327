"""The in-process engine that the latency and throughput benches drive, built from the same
flags as `openinfer serve` (and by the same function)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.interfaces.capabilities import supports_weight_bytes
from openinfer_core.plugins import get_plugin_manager
from openinfer_core.registry import Registries
from openinfer_server.bench import BenchError
from openinfer_server.demo import DEMO_SERVED_NAME, demo_checkpoint
from openinfer_server.model_source import resolve_model
from openinfer_server.serve import engine_config, setup_logging

log = logging.getLogger("openinfer.bench")


def bench_engine_config(args: argparse.Namespace,
                        parser: argparse.ArgumentParser) -> EngineConfig:
    """The engine flags checked as `serve` checks them (a bad value exits 2); the model folder
    is filled in by `load_engine`."""
    setup_logging(args.log_level)
    if args.data_parallel_size > 1:
        parser.error("argument --data-parallel-size: this bench drives one engine in its own "
                     "process; measure replicas with `openinfer serve --data-parallel-size N` "
                     "and `openinfer bench serve`")
    return engine_config(args, parser, get_plugin_manager().registries)


def model_name(args: argparse.Namespace) -> str:
    return args.model or DEMO_SERVED_NAME


def load_engine(args: argparse.Namespace, config: EngineConfig) -> Engine:
    plugins = get_plugin_manager()
    folder = _model_folder(args, plugins.registries)
    return Engine(dataclasses.replace(config, model=str(folder)), plugins)


def _model_folder(args: argparse.Namespace, registries: Registries) -> Path:
    if args.model is None:
        line, folder = demo_checkpoint(registries, args.demo)
        log.warning("benchmarking the built-in demo model (model line %s, %s)", line, folder)
        return folder
    # With --load-format dummy the engine makes the weights: only config and tokenizer needed.
    return resolve_model(args.model, with_weights=args.load_format != "dummy",
                         revision=args.revision, download_dir=args.download_dir)


def check_fits(engine: Engine, prompt_len: int, output_len: int) -> None:
    """Refuse, before anything is timed, requests the engine would reject."""
    limit = engine.model_info.max_model_len
    if prompt_len + output_len > limit:
        raise BenchError(
            f"a request of {prompt_len} prompt + {output_len} output tokens exceeds the model's "
            f"length of {limit} tokens; lower the lengths or raise --max-model-len")


def weight_bytes(engine: Engine) -> int | None:
    """Bytes of weights one decode step reads, when the model says
    (`capabilities.SupportsWeightBytes`)."""
    model = engine.model
    return model.weight_bytes if supports_weight_bytes(model) else None
