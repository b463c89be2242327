"""A tensor-parallel rank's weights kept in the checkpoint's formats (the GPU path, built here
on CPU without running a kernel): FP8 slices cut with their 128 x 128 scale blocks (`wq_b`
rows, `wo_a` rows, `wo_b` columns) and FP4 expert slices with their per-32 scales (`w1`/`w3`
rows, `w2` columns) dequantize to exactly the whole model's dequantized slices; a slice that
splits a scale block falls back to dequantized weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from openinfer_core.weights.random_checkpoint import RandomCheckpoint
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.quantized import Fp4Experts, Fp8Linear
from openinfer_deepseek_v4.reference import ModelWeights
from openinfer_deepseek_v4.shard import DeepseekV4Shard
from openinfer_deepseek_v4.weights import load_weights

BF16 = torch.bfloat16


def config() -> DeepseekV4Config:
    """Widths whose 2-rank splits fall on the scale blocks (head_dim and o_lora_rank 128, an
    expert width of 64), except the shared expert's (64 rows: half a block per rank, with or
    without expert parallelism)."""
    return DeepseekV4Config.from_dict({
        "vocab_size": 40, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "head_dim": 128, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 128,
        "sliding_window": 8, "layer_types": ["sliding_attention"] * 2,
        "mlp_layer_types": ["hash_moe", "moe"], "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 64, "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "index_n_heads": 2, "index_head_dim": 32, "index_topk": 2,
        "hc_mult": 2, "hc_sinkhorn_iters": 4, "hc_eps": 1e-6, "max_position_embeddings": 64})


def load(shard: DeepseekV4Shard | None, cfg: DeepseekV4Config, tmp: Path) -> ModelWeights:
    return load_weights(RandomCheckpoint(tmp), cfg, dtype=BF16, device=torch.device("cpu"),
                        keep_quantized=True, shard=shard)


def dense(w: object) -> torch.Tensor:
    if isinstance(w, Fp8Linear):
        return w.dequant(BF16)
    assert isinstance(w, torch.Tensor)
    return w


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "tp+ep"])
def test_quantized_slices_dequantize_to_the_whole_models(tmp_path: Path,
                                                         expert_parallel: bool) -> None:
    cfg = config()
    whole = load(None, cfg, tmp_path)
    for rank in range(2):
        shard = DeepseekV4Shard.of(cfg, rank, 2, expert_parallel)
        part = load(shard, cfg, tmp_path)
        heads = slice(shard.heads.start * cfg.head_dim, shard.heads.stop * cfg.head_dim)
        groups = slice(shard.groups.start * cfg.o_lora_rank, shard.groups.stop * cfg.o_lora_rank)
        for got, want in zip(part.layers, whole.layers, strict=True):
            a, b = got.attention, want.attention
            assert isinstance(a.q_b, Fp8Linear) and isinstance(a.o_b, Fp8Linear)
            assert torch.equal(dense(a.q_b), dense(b.q_b)[heads])
            assert torch.equal(dense(a.o_a), dense(b.o_a)[groups])
            assert torch.equal(dense(a.o_b), dense(b.o_b)[:, groups])
            m, n = got.moe, want.moe
            assert isinstance(m.gate_up, Fp4Experts) and isinstance(n.gate_up, Fp4Experts)
            e, i = shard.experts, shard.intermediate
            w1, w3 = n.gate_up.dequant_gate_up(BF16)[e.start:e.stop].chunk(2, dim=1)
            assert torch.equal(m.gate_up.dequant_gate_up(BF16),
                               torch.cat([w1[:, i.start:i.stop], w3[:, i.start:i.stop]], 1))
            assert torch.equal(m.gate_up.dequant_down(BF16),
                               n.gate_up.dequant_down(BF16)[e.start:e.stop, :, i.start:i.stop])
            shared = dense(n.shared_down)[:, shard.shared.start:shard.shared.stop]
            # 32 of the shared expert's 64 rows split an FP8 block: dequantized instead
            assert not isinstance(m.shared_down, Fp8Linear)
            assert torch.equal(dense(m.shared_down), shared)
