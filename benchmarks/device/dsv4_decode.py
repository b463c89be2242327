"""DeepSeek-V4 decode time per layer at V4-Flash's widths, against the layer's bytes and FLOPs.

A V4-Flash config cut to --layers layers (window, CSA, HCA in turn; the first hash-routed),
dummy weights in the checkpoint's formats (FP8 linears, FP4 routed experts), B requests with
--context tokens each; the decode forward is timed eagerly with CUDA events (the host's launches
included) and, where it captures, as a CUDA graph (the GPU's time); the embedding and head are
timed alone the same way and taken off, and the rest is divided by the layers. Floors: the bytes
the layer must read (every FP8/bf16/fp32 weight of the layer, the FP4 experts the batch's
routing touches, each request's window and compressed entries) at the copy bandwidth measured
in the same run, and its FLOPs at the card's dense bf16 peak.

Usage: python dsv4_decode.py [--layers 6] [--batches 1,64] [--context 2048] [--json OUT]"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))

from cuda_timing import copy_bandwidth, graph_per_call_us, median_us
from dsv4_transformers import transformers_config

from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.engine.request_state import RequestState
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.request import GenerateRequest

PEAK_BF16 = 989e12  # H100 SXM dense


def layer_cost(engine: Engine, batch: int, context: int) -> tuple[float, float]:
    """(bytes, FLOPs) of one average layer's decode step for `batch` requests."""
    cfg, w = engine.model.cfg, engine.model.w
    total_bytes = flops = 0.0
    for i, layer in enumerate(w.layers):
        dense = _tensors(layer)
        experts = layer.moe.gate_up
        per_expert = sum(t[0].numel() * t.element_size() for t in
                         (experts.gate_up, experts.gate_up_scale, experts.down,
                          experts.down_scale))
        expert_params = 2 * (experts.gate_up[0].numel() + experts.down[0].numel())
        touched = cfg.num_experts * (1 - (1 - cfg.top_k / cfg.num_experts) ** batch)
        kind, ratio = cfg.attention_kinds[i], cfg.compress_ratios[i]
        entries = cfg.sliding_window + (0 if kind == "window" else
                                        min(context // ratio, cfg.index_topk)
                                        if kind == "csa" else context // ratio)
        kv = batch * entries * cfg.head_dim * 2
        total_bytes += sum(t.numel() * t.element_size() for t in dense)
        total_bytes += touched * per_expert + kv
        params = sum(t.numel() for t in dense if t.dim() == 2) + cfg.top_k * expert_params
        flops += 2 * batch * params + 4 * batch * cfg.num_heads * entries * cfg.head_dim
    n = len(w.layers)
    return total_bytes / n, flops / n


def _tensors(layer) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Every weight tensor of a layer except the routed experts."""
    out: list[torch.Tensor] = []

    def walk(obj) -> None:  # type: ignore[no-untyped-def]
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        elif hasattr(obj, "__slots__") and obj is not layer.moe.gate_up:
            for name in obj.__slots__:
                walk(getattr(obj, name))

    walk(layer)
    return [t for t in out if t.dim() > 0 and t.dtype != torch.int64]


def make_engine(layers: int, max_batch: int, context: int) -> Engine:
    """An eager engine on a V4-Flash config cut to `layers` layers, dummy FP8/FP4 weights, KV
    room for `max_batch` requests of `context` tokens."""
    folder = Path(tempfile.mkdtemp(prefix="dsv4-decode-"))
    config = json.loads(transformers_config(layers).to_json_string())
    config["architectures"] = ["DeepseekV4ForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files

    write_tokenizer_files(folder)
    return Engine(EngineConfig(model=str(folder), device="cuda", load_format="dummy",
                               max_model_len=context + 64, max_num_seqs=max_batch,
                               num_kv_blocks=max_batch * (context // 16 + 8) + 8,
                               enforce_eager=True))


@contextlib.contextmanager
def decode_step(engine: Engine, batch: int, context: int) -> Iterator[ForwardBatch]:
    """`batch` requests prefilled to `context` tokens each, and the device batch of their
    next decode step; their KV blocks are freed on exit."""
    model = engine.model
    seqs = [RequestState.from_request(GenerateRequest(f"d{batch}-{i}", tuple(
        (i * 7919 + j * 31) % 120000 + 2 for j in range(context + 1)))) for i in range(batch)]
    try:
        for s in seqs:  # prefill each request's context, one at a time
            assert engine.kv.allocate(s.request_id, context)
            model.forward(plan_batch([ScheduledRow(s, context, True)],
                                     engine.kv).to_device(model.device))
            s.num_computed_tokens = context
            # as the scheduler does after a step: the window KV groups give back what the
            # next tokens no longer read (else the next prefill would not fit their pools)
            engine.kv.cache_blocks(s.request_id, s.token_ids, context)
        for s in seqs:
            assert engine.kv.allocate(s.request_id, context + 1)
        yield plan_batch([ScheduledRow(s, 1, True) for s in seqs],
                         engine.kv).to_device(model.device)
    finally:
        for s in seqs:
            engine.kv.free(s.request_id)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    engine = make_engine(args.layers, max(batches), args.context)
    bandwidth = copy_bandwidth()
    rows = []
    for b in batches:
        rows.append(_measure(engine, b, args.context, args.reps, bandwidth))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\nDeepSeek-V4 decode per layer, V4-Flash widths, {args.layers} layers, context "
          f"{args.context}, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print("| batch | eager step ms | eager ms/layer | graph ms/layer | bytes/layer MB | "
          "floor ms | graph × floor | GFLOP/layer | FLOP floor ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        graph = r["graph_layer_ms"]
        shown = ("-", "-") if graph is None else (
            f"{graph:.3f}", f"{graph / r['bytes_floor_ms']:.1f}")
        print(f"| {r['batch']} | {r['step_ms']:.2f} | {r['layer_ms']:.3f} | {shown[0]} | "
              f"{r['layer_bytes'] / 1e6:.0f} | {r['bytes_floor_ms']:.3f} | {shown[1]} | "
              f"{r['layer_flops'] / 1e9:.1f} | {r['flops_floor_ms']:.4f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "bandwidth": bandwidth,
                                               "layers": args.layers}, indent=2))


@torch.inference_mode()
def _measure(engine: Engine, batch: int, context: int, reps: int,
             bandwidth: float) -> dict[str, float | None]:
    with decode_step(engine, batch, context) as step:
        times = layer_times(engine, step, reps)
    layer_bytes, layer_flops = layer_cost(engine, batch, context)
    return {"batch": batch, **times, "layer_bytes": layer_bytes, "layer_flops": layer_flops,
            "bytes_floor_ms": layer_bytes / bandwidth * 1e3,
            "flops_floor_ms": layer_flops / PEAK_BF16 * 1e3}


@torch.inference_mode()
def layer_times(engine: Engine, step: ForwardBatch, reps: int) -> dict[str, float | None]:
    """The decode step `step` timed eagerly (step_ms; ends_ms, the embedding and head alone)
    and as a CUDA graph where it captures; per layer (layer_ms, graph_layer_ms: None when the
    step does not capture), the ends taken off."""
    from openinfer_deepseek_v4.reference import embed_streams, head_logits

    model, cfg = engine.model, engine.model.cfg
    step_ms = median_us(lambda: model.forward(step), reps) / 1e3
    ids = step.input_ids

    def ends() -> torch.Tensor:
        return head_logits(embed_streams(ids, model.w, cfg), model.w, cfg)

    ends_ms = median_us(ends, reps) / 1e3
    try:  # the decode step in a CUDA graph, as the engine would replay it
        graph_layer_ms: float | None = (
            graph_per_call_us([lambda: model.forward(step)]) / 1e3
            - graph_per_call_us([ends]) / 1e3) / len(model.w.layers)
    except RuntimeError as e:
        print(f"batch {step.seq_lens.shape[0]}: the decode step does not capture: {e}",
              flush=True)
        graph_layer_ms = None
    return {"step_ms": step_ms, "ends_ms": ends_ms,
            "layer_ms": (step_ms - ends_ms) / len(model.w.layers),
            "graph_layer_ms": graph_layer_ms}

if __name__ == "__main__":
    main()
