"""What structured output costs: TPOT at batch B with a JSON schema on every request against
none, in the engine (overlapped loop, CUDA graphs), and the grammar compile time per schema;
and that it holds on the GPU: 64 generated schemas sampled to the end all validate.

Each constrained request gets its own schema: an array of at least 200 objects of a generated
shape, so the grammar is live for every token measured. Requests are prefilled, then K decode
steps are timed; TPOT is the mean step time over them (every step samples one token per row).

Usage: python structured_tpot.py MODEL_DIR [--batch 1 64] [--steps 100] [--json F]
(MODEL_DIR: a config folder with tokenizer.json; weights are made up with --load-format dummy)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import jsonschema
import torch

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.events import Error, Finished, Rejected, Token
from openinfer_core.params import SamplingParams, StructuredOutput
from openinfer_core.request import GenerateRequest
from openinfer_core.structured.grammar import GrammarCompiler
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.bench.schemas import schemas

PROMPT_LEN = 128


def long_schema(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "minItems": 200, "items": item}


def run(engine: Engine, batch: int, steps: int, constrained: bool, tag: str) -> dict[str, Any]:
    shapes = schemas(batch, seed=batch + 1)
    for i in range(batch):
        spec = StructuredOutput("json", json.dumps(long_schema(shapes[i]))) \
            if constrained else None
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=steps + 64, ignore_eos=True,
                                structured=spec)
        prompt = tuple((7 * i + j) % 5000 + 100 for j in range(PROMPT_LEN))
        engine.add_request(GenerateRequest(f"{tag}-{i}", prompt, params))
    tokens: dict[str, int] = {}
    # Until every row decodes (grammars compile, prefills run), then `steps` timed steps.
    while len(tokens) < batch or min(tokens.values()) < 8:
        for e in engine.step():
            if isinstance(e, Token):
                tokens[e.request_id] = tokens.get(e.request_id, 0) + 1
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    # A row whose token broke its grammar would run unmasked from then on and look cheap.
    matchers = engine._extras.structured._matchers
    broken = sum(1 for m in matchers.values() if m.is_error())
    assert not constrained or len(matchers) == batch, (len(matchers), batch)
    for i in range(batch):
        engine.abort(f"{tag}-{i}")
    while engine.has_work():
        engine.step()
    return {"batch": batch, "structured": constrained, "steps": steps,
            "tpot_ms_mean": statistics.fmean(times) * 1e3,
            "tpot_ms_p50": statistics.median(times) * 1e3, "grammars_broken": broken}


def validate_all(engine: Engine, count: int) -> dict[str, Any]:
    """`count` bounded schemas at temperature 1, run to the end; each output must validate."""
    tokenizer = Tokenizer.from_dir(Path(engine.config.model))
    work = schemas(count, seed=77)
    for i, schema in enumerate(work):
        params = SamplingParams(temperature=1.0, seed=i, max_tokens=256,
                                structured=StructuredOutput("json", json.dumps(schema)))
        engine.add_request(GenerateRequest(f"v{i}", tuple(tokenizer.encode("JSON:")), params))
    out: dict[str, list[int]] = {f"v{i}": [] for i in range(count)}
    reasons: dict[str, str] = {}
    while engine.has_work():
        for e in engine.step():
            if isinstance(e, Token):
                out[e.request_id].append(e.token_id)
            elif isinstance(e, Finished):
                reasons[e.request_id] = e.reason
            elif isinstance(e, (Rejected, Error)):
                reasons[e.request_id] = e.message
    bad = []
    for i, schema in enumerate(work):
        try:
            jsonschema.validate(json.loads(tokenizer.decode(out[f"v{i}"])), schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            bad.append(f"v{i} ({reasons.get(f'v{i}')}): {exc!s:.120}")
    return {"schemas": count, "valid": count - len(bad), "failures": bad[:5]}


def compile_times(model_dir: Path, vocab: int, eos: tuple[int, ...], count: int
                  ) -> dict[str, float]:
    t0 = time.perf_counter()
    compiler = GrammarCompiler((model_dir / "tokenizer.json").read_text(), vocab, eos)
    setup = time.perf_counter() - t0
    took = []
    for s in schemas(count, seed=123):
        t0 = time.perf_counter()
        compiler.compile(StructuredOutput("json", json.dumps(s)))
        took.append(time.perf_counter() - t0)
    took.sort()
    return {"schemas": count, "tokenizer_setup_s": setup,
            "compile_ms_p50": took[len(took) // 2] * 1e3,
            "compile_ms_p99": took[int(0.99 * (len(took) - 1))] * 1e3,
            "compile_ms_max": took[-1] * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--json")
    args = ap.parse_args()
    engine = Engine(EngineConfig(model=args.model, load_format="dummy",
                                 max_model_len=args.max_model_len,
                                 max_num_seqs=max(args.batch)))
    rows = []
    for batch in args.batch:
        for constrained in (False, True, False, True):  # twice each, interleaved
            row = run(engine, batch, args.steps, constrained, f"b{batch}-{len(rows)}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = []
    for batch in args.batch:
        none = min(r["tpot_ms_mean"] for r in rows if r["batch"] == batch and not r["structured"])
        with_ = min(r["tpot_ms_mean"] for r in rows if r["batch"] == batch and r["structured"])
        summary.append({"batch": batch, "tpot_ms_none": none, "tpot_ms_json_schema": with_,
                        "slowdown": with_ / none - 1})
    compiled = compile_times(Path(args.model), engine.model.vocab_size, engine.eos_token_ids,
                             200)
    valid = validate_all(engine, 64)
    result = {"model": args.model, "runs": rows, "summary": summary, "compile": compiled,
              "validate": valid}
    print(json.dumps({"summary": summary, "compile": compiled, "validate": valid}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
