"""Writes the official-code reference data that tests/test_official_reference.py checks the
line against: for each tiny config below, a checkpoint (config.json in the HF form the line
reads, model.safetensors in DeepSeek's names) and, with the fake quantization off and on, what
DeepSeek's official `inference/model.py` computes on CPU in fp32 (`official_runner.py`): the
logits at every prompt position, the greedy continuation and the decode steps' logits.

    python make_reference_data.py --official /path/to/inference --out data

The weights are random (seeded) and bf16-representable, so the bf16 checkpoint holds exactly
the numbers the fp32 official model computed with. Data whose top-k boundaries (the indexer's,
the router's) or greedy picks are nearly tied is refused: `torch.topk` orders ties as it likes,
so the official choice there would be arbitrary."""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
import kernel_standin
from official_runner import Margins, build, load_official, run

# Below this gap (relative to the row's largest magnitude) a top-k boundary or a greedy pick
# could go either way between two fp32 computations that differ by summation order (~1e-6).
MIN_MARGIN = 1e-4


@dataclass(frozen=True)
class Case:
    """A tiny config (official ModelArgs fields), its prompts and how many tokens to decode."""

    args: dict[str, Any]
    prompt_lengths: tuple[int, ...]
    new_tokens: int
    seed: int
    compress_rates: dict[str, int] = field(default_factory=dict)


_TINY = dict(vocab_size=64, dim=32, moe_inter_dim=16, n_mtp_layers=0, max_batch_size=1,
             max_seq_len=128, n_shared_experts=1, score_func="sqrtsoftplus", head_dim=80,
             rope_head_dim=16, norm_eps=1e-6, hc_eps=1e-6, hc_sinkhorn_iters=20,
             beta_fast=32, beta_slow=1)

CASES = {
    # Every attention kind (window only; CSA at ratio 4, its indexer keeping 4 of up to 15
    # entries; HCA at ratio 8), two hash-routed MoE layers (one of them on the CSA layer) and a
    # score-routed one, YaRN on the compressed layers; prompts of 31-60 tokens slide the
    # 8-token window many times.
    "kinds": Case(
        args=dict(_TINY, n_layers=3, n_hash_layers=2, n_heads=4, q_lora_rank=8, o_groups=2,
                  o_lora_rank=8, window_size=8, compress_ratios=(0, 4, 8), moe_inter_dim=8,
                  n_routed_experts=8, n_activated_experts=2, route_scale=1.5, swiglu_limit=2.0,
                  index_n_heads=8, index_head_dim=32, index_topk=4, hc_mult=4,
                  rope_theta=10000.0, compress_rope_theta=160000.0, original_seq_len=16,
                  rope_factor=4),
        prompt_lengths=(31, 47, 60), new_tokens=16, seed=6,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}),
    # Less usual shapes (a CSA and an HCA layer): 2 residual streams, one head per output
    # group, a 32-dim rotary part (all of the indexer's 32 dims), HCA at ratio 16, top-1
    # routing, no hash layer, no YaRN, a window of 12, an indexer keeping 3.
    "unusual": Case(
        args=dict(_TINY, n_layers=2, n_hash_layers=0, n_heads=3, q_lora_rank=16, o_groups=3,
                  o_lora_rank=8, head_dim=96, rope_head_dim=32, window_size=12,
                  compress_ratios=(4, 16), n_routed_experts=4, n_activated_experts=1,
                  route_scale=2.5, swiglu_limit=10.0, index_n_heads=8, index_head_dim=32,
                  index_topk=3, hc_mult=2, rope_theta=10000.0, compress_rope_theta=40000.0,
                  original_seq_len=0, rope_factor=1),
        prompt_lengths=(37, 52), new_tokens=12, seed=5,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16}),
}

_KINDS = {0: "sliding_attention", 4: "compressed_sparse_attention"}


def hf_config(case: Case) -> dict[str, Any]:
    """config.json as DeepSeek's HF repository writes it, but with transformers'
    `layer_types` + `compress_rates` for the per-layer attention (the line reads DeepSeek's
    `compress_ratios` only with ratios 0, 4 and 128)."""
    a = case.args
    ratios = a["compress_ratios"]
    yarn = None if a["original_seq_len"] == 0 else {
        "type": "yarn", "factor": a["rope_factor"], "beta_fast": a["beta_fast"],
        "beta_slow": a["beta_slow"], "original_max_position_embeddings": a["original_seq_len"]}
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": a["vocab_size"], "hidden_size": a["dim"],
        "num_hidden_layers": a["n_layers"], "num_attention_heads": a["n_heads"],
        "num_key_value_heads": 1, "head_dim": a["head_dim"],
        "qk_rope_head_dim": a["rope_head_dim"], "q_lora_rank": a["q_lora_rank"],
        "o_groups": a["o_groups"], "o_lora_rank": a["o_lora_rank"],
        "sliding_window": a["window_size"],
        "layer_types": [_KINDS.get(r, "heavily_compressed_attention") for r in ratios],
        "compress_rates": case.compress_rates, "num_hash_layers": a["n_hash_layers"],
        "n_routed_experts": a["n_routed_experts"], "n_shared_experts": a["n_shared_experts"],
        "num_experts_per_tok": a["n_activated_experts"],
        "moe_intermediate_size": a["moe_inter_dim"], "scoring_func": a["score_func"],
        "routed_scaling_factor": a["route_scale"], "norm_topk_prob": True,
        "topk_method": "noaux_tc", "swiglu_limit": a["swiglu_limit"],
        "index_n_heads": a["index_n_heads"], "index_head_dim": a["index_head_dim"],
        "index_topk": a["index_topk"], "hc_mult": a["hc_mult"],
        "hc_sinkhorn_iters": a["hc_sinkhorn_iters"], "hc_eps": a["hc_eps"],
        "rms_norm_eps": a["norm_eps"], "rope_theta": a["rope_theta"],
        "compress_rope_theta": a["compress_rope_theta"], "rope_scaling": yarn,
        "max_position_embeddings": 4096, "num_nextn_predict_layers": 0,
        "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
        "hidden_act": "silu", "torch_dtype": "bfloat16"}


def fill_random(model: torch.nn.Module, seed: int) -> None:
    """Random bf16-representable weights of roughly unit-variance activations: linears
    N(0, 1/fan_in) (the head 3x, so that logits spread), norms 1 + N(0, 0.1), hyper-connection
    projections N(0, 4/fan_in), biases and scales of order 1, router biases N(0, 0.1), and in the
    hash layers a table of distinct experts per token."""
    g = torch.Generator().manual_seed(seed)
    norms = {f"{n}.weight" for n, m in model.named_modules()
             if type(m).__name__ == "RMSNorm"}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("tid2eid"):
                experts, k = model.layers[0].ffn.n_routed_experts, p.shape[1]  # type: ignore[index,union-attr]
                p.copy_(torch.stack([torch.randperm(experts, generator=g)[:k]
                                     for _ in range(p.shape[0])]))
                continue
            noise = torch.randn(p.shape, generator=g)
            if name in norms:
                value = 1 + 0.1 * noise
            elif name.endswith("_fn"):
                value = noise * 2 / math.sqrt(p.shape[1])
            elif name.endswith("_base") or name.endswith("attn_sink"):
                value = noise * 0.5
            elif name.endswith("_scale"):
                value = 1 + 0.3 * noise
            elif name.endswith("ape"):
                value = noise * 0.5
            elif name.endswith("gate.bias"):
                value = noise * 0.1
            elif name == "embed.weight":
                value = noise
            else:
                value = noise / math.sqrt(p.shape[1]) * (3 if name == "head.weight" else 1)
            p.copy_(value.to(torch.bfloat16).float())


# The tensors DeepSeek's checkpoint keeps in fp32 (spec §10.1); the rest is bf16.
def _stored(name: str, t: torch.Tensor) -> torch.Tensor:
    if name.endswith("tid2eid"):
        return t.to(torch.int64)
    last = name.rsplit(".", 1)[-1]
    fp32 = last.startswith("hc_") or last in ("attn_sink", "ape") or name.endswith("gate.bias")
    return t.contiguous() if fp32 else t.to(torch.bfloat16).contiguous()


def prompts(case: Case) -> list[list[int]]:
    rng = random.Random(case.seed)
    vocab = case.args["vocab_size"]
    return [[rng.randrange(2, vocab) for _ in range(n)] for n in case.prompt_lengths]


def make(name: str, case: Case, module: Any, out: Path) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    model = build(module, case.args)
    fill_random(model, case.seed)
    save_file({k: _stored(k, v) for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf_config(case), indent=1) + "\n")
    about: dict[str, Any] = {"model_args": case.args, "seed": case.seed,
                             "new_tokens": case.new_tokens, "margins": {}}
    for mode, sim in (("off", False), ("on", True)):
        kernel_standin.QUANT_SIM = sim
        margins, tensors = Margins(), dict[str, torch.Tensor]()
        for i, prompt in enumerate(prompts(case)):
            r = run(model, prompt, case.new_tokens, margins)
            tensors |= {f"prompt.{i}": torch.tensor(prompt), f"prefill_logits.{i}":
                        r.prefill_logits, f"greedy.{i}": r.greedy,
                        f"decode_logits.{i}": r.decode_logits}
        if min(margins.topk, margins.greedy) < MIN_MARGIN:
            raise SystemExit(f"{name}, quantization sim {mode}: a top-k boundary or greedy "
                             f"pick is nearly tied (margins {margins}); change the case's "
                             "seed or prompt lengths")
        print(f"{name}, quantization sim {mode}: smallest top-k margin {margins.topk:.1e}, "
              f"greedy margin {margins.greedy:.1e}")
        about["margins"][f"sim_{mode}"] = {"topk": float(f"{margins.topk:.3e}"),
                                           "greedy": float(f"{margins.greedy:.3e}")}
        save_file(tensors, str(folder / f"official_sim_{mode}.safetensors"))
    (folder / "official.json").write_text(json.dumps(about, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official", type=Path, required=True,
                        help="the folder of DeepSeek's inference/model.py")
    parser.add_argument("--out", type=Path, required=True, help="the data folder to write")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the same sums in the same order: the same numbers every time
    module = load_official(args.official)
    for name, case in CASES.items():
        make(name, case, module, args.out)


if __name__ == "__main__":
    main()
