"""The `openinfer` command: `serve`, `bench`, `models`, `--version`.

Parsing and `models` never import torch, so they answer at once; `serve` and `bench` import
the engine."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any

from openinfer_core.engine.config import kv_cache_dtype_error
from openinfer_core.errors import OpenInferError
from openinfer_core.generation_config import GENERATION_CONFIG_MODES
from openinfer_core.weights.quantization import QUANTIZATION_METHODS
from openinfer_server.body_limit import DEFAULT_MAX_REQUEST_BYTES

API_KEY_ENV = "OPENINFER_API_KEY"
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def package_version(dist: str = "openinfer-server") -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


# -- value checkers: a bad value is an argparse error (exit code 2), never a traceback --------
def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _port(text: str) -> int:
    value = int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 0..65535, got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _tier_list(text: str) -> tuple[str, ...]:
    tiers = tuple(t.strip() for t in text.split(","))
    if not all(tiers):
        raise argparse.ArgumentTypeError(f"must be tier names separated by commas, got {text!r}")
    if len(set(tiers)) != len(tiers):
        raise argparse.ArgumentTypeError(f"names a tier twice: {text!r}")
    return tiers


def _kv_cache_dtype(text: str) -> str:
    error = kv_cache_dtype_error(text)
    if error is not None:
        raise argparse.ArgumentTypeError(error)
    return text


def _device(text: str) -> str:
    if text in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", text):
        return text
    raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, got {text!r}")


def _quantization(text: str) -> str | None:
    if text in QUANTIZATION_METHODS:
        return text
    if text in ("None", "none"):  # vLLM's spelling of "as stored"
        return None
    raise argparse.ArgumentTypeError(
        f"{text!r} is not implemented (accepted: {', '.join(QUANTIZATION_METHODS)}, or None: "
        "the checkpoint as stored)")


def _generation_config(text: str) -> str:
    if text in GENERATION_CONFIG_MODES or os.path.isdir(text):
        return text
    raise argparse.ArgumentTypeError(f"must be auto, vllm or a folder, got {text!r}")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL and the flags that build an engine: shared by `serve` and the in-process benches."""
    # Defaults mirror EngineConfig's (a test keeps them equal); flag names are vLLM's.
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="a local HuggingFace checkpoint folder or a hub id (e.g. "
                        "Qwen/Qwen3-0.6B); leave out for the built-in demo model")
    p.add_argument("--demo", metavar="LINE",
                   help="without MODEL: serve this model line's built-in demo model (e.g. "
                        "deepseek-v4; `openinfer models` lists the lines with one) "
                        "(default: the first line's, qwen3's when installed)")
    model = p.add_argument_group("model")
    model.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                       help="auto/safetensors: the checkpoint's weights; dummy: its real shapes "
                            "with random weights (no weight download) (default %(default)s)")
    model.add_argument("--quantization", "-q", type=_quantization, metavar="METHOD",
                       help="quantize an unquantized checkpoint's linear weights at load: fp8 "
                            "(128x128 block-scaled e4m3, kept FP8 on the GPU; on an FP8 "
                            "checkpoint it changes nothing); None: as stored (default)")
    model.add_argument("--dtype", choices=DTYPES, default="auto",
                       help="weight and activation dtype; auto is float32 on CPU, the "
                            "checkpoint's dtype on GPU (default %(default)s)")
    model.add_argument("--kv-cache-dtype", type=_kv_cache_dtype, default="auto",
                       metavar="{auto,fp8,fp8_e4m3}",
                       help="KV cache pages: auto is the model's dtype; fp8 (= fp8_e4m3) stores "
                            "e4m3 with per-layer or per-head k/v scales from the checkpoint "
                            "(else 1.0), half the bytes, twice the blocks (default %(default)s)")
    model.add_argument("--max-model-len", type=int_at_least(2), metavar="N",
                       help="context length, prompt plus output (default: the model's)")
    model.add_argument("--revision", help="hub revision (branch, tag or commit) to download")
    model.add_argument("--download-dir", metavar="DIR",
                       help="hub cache folder (default: huggingface_hub's, under HF_HOME)")
    model.add_argument("--seed", type=int, default=0, help="sampling seed (default %(default)s)")
    engine = p.add_argument_group("engine")
    engine.add_argument("--device", type=_device, default="auto",
                        help="auto, cpu, cuda or cuda:N (default %(default)s)")
    engine.add_argument("--max-num-seqs", type=int_at_least(1), default=256, metavar="N",
                        help="most requests running at once (default %(default)s)")
    engine.add_argument("--max-num-batched-tokens", type=int_at_least(1), default=8192,
                        metavar="N", help="token budget of one step (default %(default)s)")
    engine.add_argument("--gpu-memory-utilization", type=_fraction, default=0.90, metavar="F",
                        help="share of GPU memory openinfer may use (default %(default)s)")
    engine.add_argument("--block-size", type=int_at_least(1), default=16, metavar="N",
                        help="tokens per KV block (default %(default)s)")
    engine.add_argument("--num-kv-blocks", type=int_at_least(2), metavar="N",
                        help="KV blocks to allocate, padding block included (default: sized "
                             "from memory)")
    engine.add_argument("--scheduler", "--scheduling-policy", default="fcfs",
                        help="scheduling policy: fcfs, priority (honours each request's "
                             "`priority`, lower first) or a plugin's from `openinfer models` "
                             "(default %(default)s)")
    engine.add_argument("--attention-backend", metavar="NAME",
                        help="attention kernels: torch, triton, flashinfer (with "
                             "openinfer-kernels[flashinfer]) or a plugin's from `openinfer "
                             "models` (default: $OPENINFER_ATTENTION_BACKEND, else the "
                             "installed backend of highest priority for the device)")
    engine.add_argument("--task", choices=("auto", "generate", "embed"), default="auto",
                        help="generate (completions, chat) or embed (/v1/embeddings: last-token "
                             "pooling); auto: embed for a checkpoint with a "
                             "sentence-transformers Pooling module (modules.json), else "
                             "generate (default %(default)s)")
    engine.add_argument("--enforce-eager", action="store_true",
                        help="never use CUDA graphs for decode")
    engine.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="reuse the KV of prompt prefixes already computed (default on)")
    engine.add_argument("--no-prefix-cache", dest="enable_prefix_caching", action="store_false",
                        help="same as --no-enable-prefix-caching")
    engine.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="overlap steps: schedule the next step while the GPU runs this "
                             "one (default on; --no-async-scheduling runs the plain loop)")
    offload = p.add_argument_group("KV offload (openinfer-offload)")
    offload.add_argument("--kv-offload", type=_tier_list, default=(), metavar="TIER[,TIER]",
                         help="keep prefixes evicted from GPU memory in tiers below it, first "
                              "to last: host (pinned DRAM), disk (a directory kept across "
                              "restarts), or a plugin's; e.g. host,disk (default: off)")
    offload.add_argument("--kv-offload-host-gib", type=_positive_float, default=8.0,
                         metavar="GIB", help="pinned host memory of the host tier, allocated "
                                             "at start (default %(default)s)")
    offload.add_argument("--kv-offload-disk-dir", metavar="DIR",
                         help="directory of the disk tier")
    offload.add_argument("--kv-offload-disk-gib", type=_positive_float, default=64.0,
                         metavar="GIB", help="most the disk tier keeps; least recently used "
                                             "blocks go first (default %(default)s)")
    engine.add_argument("--tensor-parallel-size", "-tp", type=int_at_least(1), default=1,
                        metavar="N", help="GPUs to shard the model over, one worker process "
                                          "each (NCCL on CUDA, gloo on CPU; default %(default)s)")
    engine.add_argument("--data-parallel-size", "-dp", type=int_at_least(1), default=1,
                        metavar="N", help="engine replicas behind one API, each an engine "
                        "process on its own GPU (or tensor-parallel group: replica r takes "
                        "GPUs r*TP..r*TP+TP-1 from --device); requests go to the least loaded "
                        "replica, or to the one holding their prompt's prefix unless it is "
                        "much busier (every --api-server-count frontend routes by one shared "
                        "prefix table; one node; default %(default)s)")
    nodes = torchrun_defaults(os.environ)
    engine.add_argument("--nnodes", type=int_at_least(1), default=nodes.get("nnodes", 1),
                        metavar="N", help="nodes the tensor-parallel ranks span, "
                        "tensor-parallel-size / N GPUs each (default: torchrun's "
                        "WORLD_SIZE / LOCAL_WORLD_SIZE, else %(default)s)")
    engine.add_argument("--node-rank", type=int_at_least(0), default=nodes.get("node_rank", 0),
                        metavar="R", help="this node's rank; 0 serves the API, the others "
                        "only lend their GPUs (default: NODE_RANK or torchrun's GROUP_RANK, "
                        "else %(default)s)")
    engine.add_argument("--master-addr", default=nodes.get("master_addr", "127.0.0.1"),
                        metavar="HOST", help="node 0's address, reachable from every node "
                        "(default: MASTER_ADDR, else %(default)s)")
    engine.add_argument("--master-port", type=int_at_least(1),
                        default=nodes.get("master_port", 29500), metavar="PORT",
                        help="a free TCP port on node 0 for the rendezvous (default: "
                        "MASTER_PORT, else %(default)s)")
    engine.add_argument("--enable-expert-parallel", action="store_true",
                        help="split the routed experts whole over the tensor-parallel ranks, "
                             "tokens sent to their experts' ranks (models with routed experts "
                             "only; default: every expert's width is split)")


def _add_server_arguments(p: argparse.ArgumentParser) -> None:
    net = p.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default %(default)s)")
    net.add_argument("--port", type=_port, default=8000,
                     help="port (default %(default)s; 0 picks a free one)")
    net.add_argument("--served-model-name", nargs="+", metavar="NAME",
                     help="model name(s) clients may send; the first is reported "
                          "(default: MODEL as given)")
    net.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                     help="require 'Authorization: Bearer KEY' on every route but /health "
                          f"(default: ${API_KEY_ENV}, else none)")
    net.add_argument("--metrics-without-auth", action="store_true",
                     help="with --api-key, leave /metrics open (for a Prometheus scraper)")
    net.add_argument("--max-request-bytes", type=int_at_least(1),
                     default=DEFAULT_MAX_REQUEST_BYTES, metavar="N",
                     help="largest request body accepted; a larger one gets 413 before it is "
                          "read (default %(default)s, 32 MiB)")
    net.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                     help="log verbosity (default %(default)s)")
    net.add_argument("--generation-config", type=_generation_config, default="auto",
                     metavar="auto|vllm|DIR",
                     help="sampling defaults for fields a request leaves out: auto takes "
                          "temperature, top_p, top_k, min_p, repetition_penalty and "
                          "max_new_tokens from the model's generation_config.json; vllm uses "
                          "the built-in ones; DIR a folder's generation_config.json "
                          "(default %(default)s)")
    _add_parser_arguments(p)
    net.add_argument("--api-server-count", type=int_at_least(1), default=1, metavar="N",
                     help="HTTP frontend processes sharing the port, all in front of one "
                          "engine process (default %(default)s)")
    net.add_argument("--shutdown-timeout", type=int_at_least(0), default=30, metavar="S",
                     help="on SIGTERM or Ctrl-C, how long in-flight requests may take to "
                          "finish before the server stops (default %(default)s s)")


def _add_parser_arguments(p: argparse.ArgumentParser) -> None:
    # The policy is parser_choice.py's; names are checked against the plugins at start.
    tools = p.add_argument_group("tool calling and reasoning")
    tools.add_argument("--tool-call-parser", metavar="NAME",
                       help="how tool calls are read from the output (hermes, or a plugin's "
                            "from `openinfer models`); none turns tool-call parsing off "
                            "(default: the model line's, hermes for Qwen3)")
    tools.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="accepted for vLLM command lines: tool_choice \"auto\" works "
                            "whenever a tool-call parser is set; this only checks one is")
    tools.add_argument("--reasoning-parser", metavar="NAME",
                       help="split reasoning from content into reasoning_content (qwen3, "
                            "deepseek_r1, or a plugin's) (default: off)")


def _add_bench_parser(
        commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Only argparse is imported here: `openinfer bench --help` stays quick.
    from openinfer_server.bench import options

    bench = commands.add_parser(
        "bench", help="benchmark: batch-1 latency, offline throughput, prefix-cache TTFT, or a "
                      "running server",
        description="Benchmark openinfer the way `vllm bench` does; every run also measures "
                    "the device's ceilings (memory read bandwidth, bf16 matmul rate).")
    modes = bench.add_subparsers(dest="bench_mode", metavar="MODE", required=True)
    for name, help_text, add_mode_arguments in options.MODES:
        mode = modes.add_parser(name, help=help_text, description=help_text)
        if name in options.ENGINE_MODES:
            add_engine_arguments(mode)
            mode.add_argument("--log-level", choices=LOG_LEVELS, default="warning",
                              help="log verbosity (default %(default)s)")
        add_mode_arguments(mode)
        mode.set_defaults(mode_parser=mode)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openinfer", description="openinfer: an OpenAI-compatible LLM inference server.")
    parser.add_argument("--version", action="version", version=f"openinfer {package_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve", help="serve a model over the OpenAI API",
        description="Serve MODEL over an OpenAI-compatible HTTP API (/v1/completions, "
                    "/v1/chat/completions, /v1/models, /health, /metrics).")
    add_engine_arguments(serve)
    _add_server_arguments(serve)
    _add_bench_parser(commands)
    commands.add_parser(
        "models", help="list installed model lines, schedulers, attention backends, "
                       "offload tiers and output parsers",
        description="List what the installed plugins provide.")
    return parser


# -- openinfer models ---------------------------------------------------------------------
def _table(title: str, rows: list[list[str]]) -> list[str]:
    lines = [f"{title}:"]
    if not rows:
        return [*lines, "  (none installed)"]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append(("  " + "  ".join(cells)).rstrip())
    return lines


def describe_plugins() -> str:
    """What `openinfer models` prints: every registry, with the plugin behind each entry."""
    from openinfer_core.plugins import get_plugin_manager

    regs = get_plugin_manager().registries
    models = [[e.name, ", ".join(e.meta.get("architectures", ())) or "(probe)",
               f"plugin {e.plugin}", "demo model" if e.meta.get("demo") else ""]
              for e in regs.models.entries()]
    schedulers = [[e.name, f"plugin {e.plugin}"] for e in regs.schedulers.entries()]
    backends = [[e.name, "devices " + ",".join(e.meta.get("devices", ())),
                 f"priority {e.meta.get('priority', 0)}", f"plugin {e.plugin}"]
                for e in regs.attention_backends.entries()]
    tiers = [[e.name, f"plugin {e.plugin}"] for e in regs.offload_tiers.entries()]
    tool_parsers = [[e.name, f"plugin {e.plugin}"] for e in regs.tool_parsers.entries()]
    reasoning_parsers = [[e.name, f"plugin {e.plugin}"]
                         for e in regs.reasoning_parsers.entries()]
    plugins = []
    for ep in sorted(entry_points(group="openinfer"), key=lambda ep: ep.name):
        dist = ep.dist
        plugins.append([ep.name, ep.value,
                        f"{dist.name} {dist.version}" if dist is not None else ""])
    sections = [
        _table("model lines", models), _table("schedulers", schedulers),
        _table("attention backends", backends), _table("offload tiers", tiers),
        _table("tool parsers", tool_parsers), _table("reasoning parsers", reasoning_parsers),
        _table("plugins", plugins),
    ]
    return "\n".join(line for section in sections for line in [*section, ""]).rstrip() + "\n"


def torchrun_defaults(env: Mapping[str, str]) -> dict[str, Any]:
    """Defaults for the node flags from torchrun's environment (or a launcher that sets the
    same variables): MASTER_ADDR, MASTER_PORT, the node's rank (NODE_RANK, else torchrun's
    GROUP_RANK) and the node count (NNODES, else WORLD_SIZE / LOCAL_WORLD_SIZE)."""
    found: dict[str, Any] = {}
    if "MASTER_ADDR" in env:
        found["master_addr"] = env["MASTER_ADDR"]
    if env.get("MASTER_PORT", "").isdigit():
        found["master_port"] = int(env["MASTER_PORT"])
    rank = env.get("NODE_RANK") or env.get("GROUP_RANK")
    if rank is not None and rank.isdigit():
        found["node_rank"] = int(rank)
    nnodes = env.get("NNODES")
    if nnodes is None and env.get("WORLD_SIZE", "").isdigit() and env.get(
            "LOCAL_WORLD_SIZE", "").isdigit() and int(env["LOCAL_WORLD_SIZE"]) > 0:
        nnodes = str(int(env["WORLD_SIZE"]) // int(env["LOCAL_WORLD_SIZE"]))
    if nnodes is not None and nnodes.isdigit():
        found["nnodes"] = int(nnodes)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "models":
            sys.stdout.write(describe_plugins())
            return 0
        if args.command == "bench":
            from openinfer_server.bench import run_bench

            args.argv = ["openinfer", *(sys.argv[1:] if argv is None else argv)]
            return run_bench(args, args.mode_parser)
        from openinfer_server.serve import serve

        return serve(args, parser, started=started)
    except OpenInferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
