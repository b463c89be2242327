"""Host cost and GPU idle time per decode step, by batch size, plain and overlapped loops.

For each batch size B, B requests (128-token prompts, ignore_eos) are prefilled, then K decode
steps are timed: wall time per step, and the host time inside it by part (schedule, launch =
batch layout + kernel launches, wait for the tokens, update = events and stop checks), plus
the IPC cost of the step's message (msgspec encode on the engine side, decode and conversion to
events on the frontend side). On CUDA the torch profiler records the kernels of K steps: the
GPU is idle for the part of the window that no kernel covers.

Usage: python step_timeline.py MODEL_DIR [--batch 1 64 256 512] [--steps 30] [--json F]
(MODEL_DIR: a config folder; weights are made up with --load-format dummy on CUDA)."""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import msgspec
import torch
from decode_breakdown import category, gpu_work
from torch.profiler import ProfilerActivity, profile

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.engine.overlap import OverlappedLoop
from openinfer_core.engine.runner import Launched
from openinfer_core.events import Token
from openinfer_core.handle import LoadSnapshot
from openinfer_core.ipc.wire import FromEngine, StepOutput, from_wire, to_wire
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest

ORIGINAL_RESULT = Launched.result


class Timers:
    """Wraps methods of live objects to add up the seconds spent in them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj: object, method: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start

        setattr(obj, method, timed)


def wrap_results(timers: Timers) -> None:
    """Time the wait inside `Launched.result()` (a slots class: patched on the class)."""
    timers.wrap(Launched, "result", "wait")


def gpu_idle(prof: Any, wall_s: float) -> dict[str, float]:
    spans = [(start, end) for start, end, _ in gpu_work(prof)]
    if not spans:
        return {}
    busy, end = 0.0, spans[0][0]
    for start, stop in spans:
        start = max(start, end)
        if stop > start:
            busy += stop - start
            end = stop
    window = spans[-1][1] - spans[0][0]
    return {"gpu_busy_ms": busy / 1e3, "gpu_window_ms": window / 1e3,
            "gpu_idle_pct": 100.0 * (1 - busy / window) if window else 0.0,
            "profiled_wall_ms": wall_s * 1e3}


def ipc_cost(batch: int, repeats: int = 20) -> dict[str, float]:
    events = [Token(f"cmpl-{i:032x}-0", 1000 + i) for i in range(batch)]
    load = LoadSnapshot(batch, 0, 1000, 10000)
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(FromEngine)
    start = time.perf_counter()
    for _ in range(repeats):
        data = encoder.encode(StepOutput([to_wire(e) for e in events], load))
    encode = (time.perf_counter() - start) / repeats
    start = time.perf_counter()
    for _ in range(repeats):
        msg = decoder.decode(data)
        assert isinstance(msg, StepOutput)
        [from_wire(e) for e in msg.events]
    decode = (time.perf_counter() - start) / repeats
    return {"ipc_encode_ms": encode * 1e3, "ipc_decode_ms": decode * 1e3,
            "ipc_bytes": len(data)}


def make_engine(model: str, device: str, max_batch: int, input_len: int) -> Engine:
    cuda = device == "cuda"
    return Engine(EngineConfig(
        model=model, device=device, load_format="dummy" if cuda else "auto",
        max_model_len=max(1024, input_len + 512) if cuda else 512, max_num_seqs=max_batch,
        max_num_batched_tokens=8192, async_scheduling=True))


def measure(engine: Engine, overlapped: OverlappedLoop, batch: int, steps: int, overlap: bool,
            profile_gpu: bool, input_len: int = 128) -> dict[str, Any]:
    cuda = engine.model.device.type == "cuda"
    engine._overlap = overlapped if overlap else None  # the same engine runs either loop
    params = SamplingParams(temperature=0.0, max_tokens=3 * steps + 40, ignore_eos=True)
    for i in range(batch):
        engine.add_request(GenerateRequest(f"b{batch}-{overlap}-{i}",
                                           tuple(range(i, i + input_len)), params))
    while engine.snapshot().waiting or any(  # until every request decodes
            s.num_computed_tokens < s.num_tokens - 1
            for s in engine.scheduler.running):  # type: ignore[attr-defined]
        engine.step()
    for _ in range(5):
        engine.step()
    timers = Timers()
    timers.wrap(engine.scheduler, "schedule", "schedule")
    timers.wrap(engine.scheduler, "launched", "launched")
    timers.wrap(engine.scheduler, "update", "update")
    timers.wrap(engine.runner, "forward", "launch")  # launch = forward + sample
    timers.wrap(engine.runner, "sample", "launch")
    timers.wrap(Launched, "result", "wait")
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - start
    Launched.result = ORIGINAL_RESULT  # type: ignore[method-assign]
    result: dict[str, Any] = {
        "batch": batch, "input_len": input_len, "loop": "overlapped" if overlap else "plain",
        "steps": steps,
        "step_ms": wall / steps * 1e3, "output_tok_s": batch * steps / wall,
        **{f"{k}_ms": v / steps * 1e3 for k, v in timers.seconds.items()},
    }
    # Host time: the step's wall time less its waits for the device (in the plain loop the
    # wait is `Launched.result` after forward and sample).
    result["host_ms"] = result["step_ms"] - result.get("wait_ms", 0.0)
    if cuda and profile_gpu:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            torch.cuda.synchronize()
            profiled = time.perf_counter() - start
        result.update(gpu_idle(prof, profiled))
        by_op: dict[str, float] = defaultdict(float)
        for e in prof.key_averages():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                by_op[category(e.key)] += e.self_device_time_total / 1e3 / steps
        result["gpu_ms_by_op"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1]))
    result.update(ipc_cost(batch))
    for name in ("schedule", "launched", "update"):  # unwrap
        delattr(engine.scheduler, name)
    delattr(engine.runner, "forward")
    delattr(engine.runner, "sample")
    while engine.has_work():  # let every request end
        engine.step()
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256, 512])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    ap.add_argument("--loops", nargs="+", default=["overlapped", "plain"])
    ap.add_argument("--profile-batch", type=int, nargs="*", default=[256],
                    help="batch sizes whose GPU timeline is profiled")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    engine = make_engine(args.model, args.device, max(args.batch), args.input_len)
    overlapped = engine._overlap
    assert overlapped is not None
    for batch in args.batch:
        for loop in args.loops:
            row = measure(engine, overlapped, batch, args.steps, loop == "overlapped",
                          batch in args.profile_batch, args.input_len)
            rows.append(row)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
