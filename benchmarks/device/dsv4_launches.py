"""How many kernels a DeepSeek-V4 decode step launches, per layer and sublayer: the count
that bounds a CUDA-graph replay once each kernel is a few microseconds.

GPU (default): V4-Flash widths cut to --layers layers (window, CSA, HCA in turn), dummy
FP8/FP4 weights, B requests of --context tokens; one eager decode forward under
torch.profiler, the GPU's kernels (and memsets/memcpys) in stream order, cut into sublayers
by a marker kernel launched between them (`torch.cuda._sleep(0)`, not counted); then the
same step timed per layer (`dsv4_decode.layer_times`: eager, and as a CUDA graph). One engine
serves every batch; the defaults (3 layers, batch 1) run in well under a minute once Triton's
cache is warm.

--cpu: the same on a tiny config without a GPU, approximately: each aten op that would launch
a kernel on the GPU (views, allocations and empty results left out) plus each Triton kernel,
the ops' Triton paths run under the interpreter (TRITON_INTERPRET=1) in place of their CPU
references; the routed experts run their CPU reference, so the MoE sublayer's count is not
the GPU's.

Usage: python dsv4_launches.py [--layers 3] [--batches 1] [--context 2048] [--cpu [--where]]"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if "--cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SUBLAYERS = ("attn", "ffn")


class _Marks:
    """Sublayer boundaries: `_around` wrapped so each sublayer call is bracketed by `mark`."""

    def __init__(self, mark: Callable[[str], None]) -> None:
        self.mark = mark
        self.calls = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import openinfer_deepseek_v4.model as m

        original = m._around

        def around(*args: Any, **kwargs: Any) -> Any:
            layer, part = divmod(self.calls, 2)
            self.calls += 1
            self.mark(f"L{layer}.{SUBLAYERS[part]}")
            out = original(*args, **kwargs)
            self.mark("")
            return out

        m._around = around  # type: ignore[assignment]
        try:
            yield
        finally:
            m._around = original  # type: ignore[assignment]


def _split(names: list[str], markers: list[tuple[int, str]]) -> dict[str, Counter[str]]:
    """Kernel names in launch order cut at markers (index, label): {label: names}."""
    out: dict[str, Counter[str]] = {}
    bounds = [*markers, (len(names), "")]
    out["outside"] = Counter(names[:bounds[0][0]] if markers else names)
    for (start, label), (end, _) in itertools.pairwise(bounds):
        out.setdefault(label or "outside", Counter()).update(names[start:end])
    return out


def _report(parts: dict[str, Counter[str]], title: str, top: int) -> dict[str, Any]:
    per = {k: sum(v.values()) for k, v in parts.items()}
    layers = sorted({k.split(".")[0] for k in per if k.startswith("L")}, key=lambda s: int(s[1:]))
    print(f"\n{title}: {sum(per.values())} launches a step")
    print("| layer | attn | ffn | total |")
    print("|---|---:|---:|---:|")
    for layer in layers:
        a, f = per.get(f"{layer}.attn", 0), per.get(f"{layer}.ffn", 0)
        print(f"| {layer} | {a} | {f} | {a + f} |")
    print(f"| outside layers | | | {per.get('outside', 0)} |")
    inside = Counter[str]()
    for k, v in parts.items():
        if k.startswith("L") and k.endswith(".attn"):
            inside.update(v)
    print(f"attention sublayers, top {top} launches:")
    for name, n in inside.most_common(top):
        print(f"{n:6d}  {name}")
    return {"per_sublayer": per, "attention_kernels": dict(inside)}


# --- GPU ---------------------------------------------------------------------------------

def gpu_counts(engine: Any, batch: int, context: int, top: int) -> dict[str, Any]:
    from dsv4_decode import decode_step, layer_times
    from torch.profiler import ProfilerActivity, profile

    model = engine.model
    layers = len(model.w.layers)
    marks: list[str] = []

    def mark(label: str) -> None:
        marks.append(label)
        torch.cuda._sleep(0)

    with torch.inference_mode(), decode_step(engine, batch, context) as step:
        model.forward(step)
        torch.cuda.synchronize()
        with _Marks(mark).installed(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            model.forward(step)
            torch.cuda.synchronize()
        times = layer_times(engine, step, reps=10)
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    names, markers = [], []
    for e in kernels:
        if "spin" in e.name.lower() and len(markers) < len(marks):
            markers.append((len(names), marks[len(markers)]))
        else:
            names.append(e.name[:90])
    if len(markers) != len(marks):
        raise RuntimeError(f"found {len(markers)} of {len(marks)} marker kernels")
    report = _report(_split(names, markers), f"GPU, batch {batch}, {layers} layers", top)
    graph = times["graph_layer_ms"]
    print(f"decode per layer, context {context}: eager {times['layer_ms']:.3f} ms, CUDA graph "
          f"{'-' if graph is None else f'{graph:.3f}'} ms")
    return {**report, **times}


# --- CPU (interpreter) -------------------------------------------------------------------

class _AtenCounter(TorchDispatchMode):
    """Records each aten op that would launch a kernel on the GPU."""

    SKIP = ("empty", "new_empty", "lift_fresh", "size", "stride", "sym_", "is_same_size",
            "resolve_", "_has_compatible_shallow_copy_type", "set_")

    def __init__(self, names: list[str], where: bool = False) -> None:
        super().__init__()
        self.names = names
        self.paused = False
        self.where = where

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if self.paused or name.startswith(self.SKIP):
            return out
        results = [t for t in (out if isinstance(out, (tuple, list)) else [out])
                   if isinstance(t, torch.Tensor)]
        if func.is_view and _aliases(results, args):  # `to`, `reshape`: views when they can be
            return out
        if name == "_local_scalar_dense":
            self.names.append("HOST SYNC (item)")
        elif not results or any(t.numel() for t in results):
            self.names.append(f"aten.{name}{_caller() if self.where else ''}")
        return out


def _caller() -> str:
    """' @ file:line' of the innermost frame in the model's or the kernels' package."""
    import traceback

    for frame in reversed(traceback.extract_stack()[:-2]):
        if "openinfer_deepseek_v4" in frame.filename or "openinfer_kernels" in frame.filename:
            return f" @ {Path(frame.filename).name}:{frame.lineno}"
    return ""


def _aliases(results: list[torch.Tensor], args: Any) -> bool:
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    return all(t.untyped_storage().data_ptr() in inputs for t in results)


def _force_triton() -> None:
    """Every `by_device` op imported into the model's and kernels' modules: its Triton path."""
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith(("openinfer_deepseek_v4",
                                                           "openinfer_kernels")):
            continue
        for name, obj in list(vars(module).items()):
            code = getattr(obj, "__code__", None)
            if code is None or code.co_name != "op" or obj.__closure__ is None:
                continue
            cells = dict(zip(code.co_freevars, (c.cell_contents for c in obj.__closure__),
                             strict=True))
            if cells.get("triton") is not None and "reference" in cells:
                if "moe" in getattr(cells["triton"], "__module__", ""):
                    continue  # the experts' kernel needs FP4 weights: the reference runs
                setattr(module, name, cells["triton"])


def cpu_counts(layers: int, batch: int, context: int, top: int,
               where: bool = False) -> dict[str, Any]:
    from dsv4_decode import decode_step

    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
    from dsv4_transformers import transformers_config

    tiny = dict(hidden_size=64, num_attention_heads=4, head_dim=32,
                qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16,
                n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                index_n_heads=4, index_head_dim=32, index_topk=8, sliding_window=16)
    folder = Path(tempfile.mkdtemp(prefix="dsv4-launches-"))
    config = json.loads(transformers_config(layers, **tiny).to_json_string())
    config["architectures"] = ["DeepseekV4ForCausalLM"]
    config["compress_rates"] = {"compressed_sparse_attention": 4,
                                "heavily_compressed_attention": 8}
    (folder / "config.json").write_text(json.dumps(config))
    from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files

    write_tokenizer_files(folder)
    engine = Engine(EngineConfig(model=str(folder), device="cpu", load_format="dummy",
                                 dtype="bfloat16", max_model_len=context + 64, max_num_seqs=batch,
                                 num_kv_blocks=batch * (context // 16 + 8) + 8,
                                 enforce_eager=True))
    names: list[str] = []
    counter = _AtenCounter(names, where)
    markers: list[tuple[int, str]] = []
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def counted_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(f"triton {getattr(self.fn, '__name__', '?')}")
        counter.paused = True
        try:
            return run(self, *args, **kwargs)
        finally:
            counter.paused = False

    with torch.inference_mode(), decode_step(engine, batch, context) as step:
        _force_triton()  # after the prefill, which runs the CPU references
        InterpretedFunction.run = counted_run  # type: ignore[method-assign]
        try:
            with _Marks(lambda label: markers.append((len(names), label))).installed(), \
                    counter:
                engine.model.forward(step)
        finally:
            InterpretedFunction.run = run  # type: ignore[method-assign]
    return _report(_split(names, markers), f"CPU (interpreter, approximate), batch {batch}, "
                   f"{layers} layers", top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--where", action="store_true",
                    help="--cpu: name each aten op's line in the model's or kernels' code")
    ap.add_argument("--json")
    args = ap.parse_args()
    start = time.perf_counter()
    batches = [int(b) for b in args.batches.split(",")]
    if args.cpu:
        results = [cpu_counts(args.layers, b, args.context, args.top, args.where)
                   for b in batches]
    else:
        from dsv4_decode import make_engine

        engine = make_engine(args.layers, max(batches), args.context)
        results = [gpu_counts(engine, b, args.context, args.top) for b in batches]
    print(f"\n{time.perf_counter() - start:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))

if __name__ == "__main__":
    main()
