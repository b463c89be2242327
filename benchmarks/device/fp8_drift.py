"""Online FP8 (`--quantization fp8`) against bf16 on the same random-weight Qwen3 (the dummy
weights of one seed): teacher-forced prompt logprobs over N random prompts, |Δ logprob| of the
prompt tokens (mean, p99, max) and top-1 agreement. This is the drift of quantizing the
weights (plus, on a GPU with FP8 kept, the W8A8 prompt products' activation rounding), not the
kernels' error, which tests/gpu/test_fp8_gate_gpu.py measures.
On the CPU (`--tiny --device cpu`) the quantized weights are dequantized again at load, so the
drift is the weights' alone.
Usage: python fp8_drift.py [--shape Qwen3-8B] [--layers N] [--prompts 16] [--prompt-len 256]
                           [--device cuda] [--tiny] [--json F]"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

# A Qwen3 small enough for the CPU, with 128-row-aligned linears as the real ones have.
TINY: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False, "initializer_range": 0.02,
    "eos_token_id": 0,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="Qwen3-8B", help="a published Qwen3 config's shapes")
    p.add_argument("--tiny", action="store_true", help="a tiny Qwen3 (CPU-sized) instead")
    p.add_argument("--layers", type=int, help="keep this many layers (default: all)")
    p.add_argument("--std", type=float, help="the random weights' std (initializer_range)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the figures here")
    return p.parse_args(argv)


def write_model(args: argparse.Namespace, dest: Path) -> dict[str, Any]:
    """The config folder the dummy weights are made for; returns its config."""
    from openinfer_qwen3.shapes import write_config_folder

    if args.tiny:
        dest.mkdir(parents=True, exist_ok=True)
        config = dict(TINY)
    else:
        write_config_folder(args.shape, dest)
        config = json.loads((dest / "config.json").read_text())
    if args.layers:
        config["num_hidden_layers"] = args.layers
    if args.std:
        config["initializer_range"] = args.std
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from openinfer_core import Engine, EngineConfig
    from openinfer_core.testing import logprob_drift, prompt_logprobs

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as folder:
        config = write_model(args, Path(folder) / "model")
        prompts = [[rng.randrange(config["vocab_size"]) for _ in range(args.prompt_len)]
                   for _ in range(args.prompts)]
        sides = {}
        for name, quantization in (("bf16", None), ("fp8", "fp8")):
            engine = Engine(EngineConfig(
                model=str(Path(folder) / "model"), device=args.device, dtype=args.dtype,
                load_format="dummy", seed=args.seed, quantization=quantization,
                max_model_len=args.prompt_len + 8, max_num_seqs=args.prompts,
                max_num_batched_tokens=max(8192, args.prompt_len)))
            sides[name] = prompt_logprobs(engine, prompts)
            engine.close()
            del engine
    row = {"model": "tiny" if args.tiny else args.shape,
           "layers": config["num_hidden_layers"], "std": config.get("initializer_range"),
           "prompts": args.prompts, "prompt_len": args.prompt_len, "device": args.device,
           **logprob_drift(sides["bf16"], sides["fp8"])}
    print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(row, indent=2) + "\n")
    return row


if __name__ == "__main__":
    main()
