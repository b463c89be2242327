"""Embeddings per second at Qwen3-0.6B's shapes (Qwen3-Embedding-0.6B's), inputs of 512 tokens,
over a sweep of batch sizes (inputs submitted at once), through the engine with task embed and
dummy weights; beside the bf16 matmul ceiling measured in the same run. The model's matmul
FLOPs per token (2 x the non-embedding weights, plus attention's QK and PV) turn each rate into
a fraction of that ceiling.
Usage: python embed_bench.py [--input-len 512] [--batches 1,8,32,128,256] [--json F]"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPE = "Qwen3-0.6B"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--batches", default="1,8,32,128,256",
                   help="comma-separated numbers of inputs submitted at once")
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per batch (best kept)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", type=Path, help="write the rows here")
    return p.parse_args(argv)


def flops_per_token(config: dict[str, Any], input_len: int) -> float:
    """Matmul FLOPs of one token of a `input_len`-token input: the linears, and attention's
    two products over the causal half of the prompt on average."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv_heads, d = (config["num_attention_heads"], config["num_key_value_heads"],
                          config["head_dim"])
    linears = h * (heads + 2 * kv_heads) * d + heads * d * h + 3 * h * i
    attention = 2 * heads * d * (input_len / 2)
    return 2.0 * layers * (linears + attention)


def run_batch(engine: Any, batch: int, input_len: int, vocab: int, tag: str) -> float:
    """Seconds from submitting `batch` pooling requests to their last embedding."""
    import torch

    from openinfer_core.events import Embedding
    from openinfer_core.request import GenerateRequest

    rng = random.Random(hash(tag))
    requests = [GenerateRequest(f"{tag}-{k}", tuple(rng.randrange(vocab) for _ in range(input_len)),
                                pooling=True) for k in range(batch)]
    torch.cuda.synchronize()
    started = time.perf_counter()
    for r in requests:
        engine.add_request(r)
    got = 0
    while engine.has_work():
        got += sum(isinstance(e, Embedding) for e in engine.step())
    took = time.perf_counter() - started
    if got != batch:
        raise RuntimeError(f"{got} embeddings for {batch} inputs")
    return took


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    import torch

    from openinfer_core.engine.config import EngineConfig
    from openinfer_core.engine.engine import Engine
    from openinfer_qwen3.shapes import QWEN3_SHAPES, write_config_folder
    from openinfer_server.bench.ceiling import measure_ceiling

    device = torch.device(args.device)
    ceiling = measure_ceiling(device)
    folder = write_config_folder(SHAPE, Path(tempfile.mkdtemp()) / "qwen3-0.6b")
    config = QWEN3_SHAPES[SHAPE]
    engine = Engine(EngineConfig(
        model=str(folder), device=args.device, task="embed", load_format="dummy",
        max_model_len=max(args.input_len + 16, 1024), max_num_seqs=max(batches),
        max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=False))
    run_batch(engine, min(batches), args.input_len, config["vocab_size"], "warm")
    per_token = flops_per_token(config, args.input_len)
    rows = []
    for batch in batches:
        best = min(run_batch(engine, batch, args.input_len, config["vocab_size"], f"b{batch}r{r}")
                   for r in range(args.rounds))
        tokens = batch * args.input_len
        tflops = per_token * tokens / best / 1e12
        rows.append({"batch": batch, "input_len": args.input_len, "seconds": best,
                     "embeddings_per_s": batch / best, "tokens_per_s": tokens / best,
                     "matmul_tflops": tflops,
                     "of_matmul_ceiling": tflops / ceiling.matmul_tflops})
        print(f"batch {batch:4d}: {batch / best:9.1f} embeddings/s, {tokens / best:11.0f} "
              f"tokens/s, {tflops:6.1f} TFLOP/s = {tflops / ceiling.matmul_tflops:.0%} of the "
              f"bf16 matmul ceiling ({ceiling.matmul_tflops:.0f} TFLOP/s)")
    engine.close()
    result = {"shape": SHAPE, "ceiling": ceiling.as_dict(), "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
