"""llguidance vs xgrammar on the work structured output asks of them, with the Qwen3 vocabulary:
tokenizer set-up, compile time per JSON schema (no cache), and per token the mask fill and the
advance, along a valid instance of each schema. Either library may be missing; it is skipped.

    uv run --with xgrammar --with apache-tvm-ffi python benchmarks/grammar_libraries.py \
        --schemas 100 --json benchmarks/results/2026-11-23-cpu-grammar-libraries.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import random
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from openinfer_qwen3.tokenizer_files import qwen3_tokenizer_json
from openinfer_server.bench.schemas import random_instance, schemas

EOS = 151645  # <|im_end|>


def _llguidance(tok_json: str, vocab: int, work: list[tuple[dict[str, Any], list[int]]]
                ) -> dict[str, float]:
    import llguidance
    import llguidance.torch as lt

    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(tok_json, n_vocab=vocab, eos_token=EOS)
    setup = time.perf_counter() - t0
    compile_s, fill_s, advance_s, first_fill = [], [], [], []
    mask = lt.allocate_token_bitmask(1, vocab)
    for schema, ids in work:
        t0 = time.perf_counter()
        # The grammar the engine compiles: no free whitespace (as xgrammar's below).
        m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}))
        compile_s.append(time.perf_counter() - t0)
        assert not m.is_error(), m.get_error()
        for t in [*ids, EOS]:
            t0 = time.perf_counter()
            lt.fill_next_token_bitmask(m, mask, 0)
            t1 = time.perf_counter()
            ok = m.consume_token(t)
            t2 = time.perf_counter()
            assert ok, m.get_error()
            if len(first_fill) < len(compile_s):
                first_fill.append(t1 - t0)
            fill_s.append(t1 - t0)
            advance_s.append(t2 - t1)
    return _summary(setup, compile_s, fill_s, advance_s, first_fill)


def _xgrammar(tok_json: str, vocab: int, work: list[tuple[dict[str, Any], list[int]]]
              ) -> dict[str, float]:
    import xgrammar as xgr

    t0 = time.perf_counter()
    hf = Tokenizer.from_str(tok_json)
    encoded = [""] * vocab
    for piece, i in hf.get_vocab(with_added_tokens=True).items():
        if i < vocab:
            encoded[i] = piece
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab,
                             stop_token_ids=[EOS], add_prefix_space=False)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    setup = time.perf_counter() - t0
    compile_s, fill_s, advance_s, first_fill = [], [], [], []
    mask = xgr.allocate_token_bitmask(1, vocab)
    for schema, ids in work:
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                separators=(",", ":"))
        m = xgr.GrammarMatcher(compiled)
        compile_s.append(time.perf_counter() - t0)
        for t in [*ids, EOS]:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(mask, 0)
            t1 = time.perf_counter()
            ok = m.accept_token(t)
            t2 = time.perf_counter()
            assert ok, (schema, ids, t)
            if len(first_fill) < len(compile_s):
                first_fill.append(t1 - t0)
            fill_s.append(t1 - t0)
            advance_s.append(t2 - t1)
    return _summary(setup, compile_s, fill_s, advance_s, first_fill)


def _summary(setup: float, compile_s: list[float], fill_s: list[float],
             advance_s: list[float], first_fill: list[float]) -> dict[str, float]:
    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[max(0, math.ceil(q * len(xs)) - 1)] * 1e3  # nearest rank

    firsts = [c + f for c, f in zip(compile_s, first_fill, strict=True)]
    return {"tokenizer_setup_ms": setup * 1e3,
            "compile_and_first_mask_ms_p50": statistics.median(firsts) * 1e3,
            "compile_and_first_mask_ms_p99": pct(firsts, 0.99),
            "compile_ms_p50": statistics.median(compile_s) * 1e3,
            "compile_ms_p99": pct(compile_s, 0.99), "compile_ms_max": max(compile_s) * 1e3,
            "mask_us_p50": statistics.median(fill_s) * 1e6, "mask_ms_p99": pct(fill_s, 0.99),
            "advance_us_p50": statistics.median(advance_s) * 1e6, "tokens": len(fill_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--schemas", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    tok_json = qwen3_tokenizer_json()
    hf = Tokenizer.from_str(tok_json)
    vocab = 151936  # Qwen3's embedding rows (the tokenizer has fewer ids)
    rng = random.Random(args.seed)
    work = []
    for schema in schemas(args.schemas, args.seed):
        text = json.dumps(random_instance(schema, rng), separators=(",", ":"))
        work.append((schema, hf.encode(text, add_special_tokens=False).ids))
    torch.set_num_threads(1)
    out: dict[str, Any] = {"machine": platform.processor() or platform.machine(),
                           "schemas": args.schemas}
    for name, fn in (("llguidance", _llguidance), ("xgrammar", _xgrammar)):
        try:
            out[name] = fn(tok_json, vocab, work)
        except ImportError as exc:
            out[name] = f"not installed: {exc}"
    out["versions"] = {}
    for name in ("llguidance", "xgrammar"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out["versions"][name] = metadata.version(name)
    out["threads"] = 1  # torch and xgrammar's compiler; llguidance compiles on the caller's
    out["command"] = "python benchmarks/grammar_libraries.py " + " ".join(sys.argv[1:])
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
