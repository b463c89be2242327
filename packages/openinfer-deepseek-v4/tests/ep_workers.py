"""Expert parallelism on two real ranks (gloo): a spawned process per rank runs its part of
the MoE (`moe_forward` over its own experts and its slice of the shared expert) and the
all-reduce over a few chosen steps, with weights both make from one seed, and sends back the
sum (`test_expert_parallel.py` compares it with one rank's `reference.moe`)."""

from __future__ import annotations

import multiprocessing.connection
from pathlib import Path

import torch

from openinfer_core.distributed.group import TorchTensorParallelGroup
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.moe_forward import moe_forward
from openinfer_deepseek_v4.reference import MoEWeights
from openinfer_deepseek_v4.shard import DeepseekV4Shard

HIDDEN, EXPERTS, TOP_K, INTER, VOCAB = 16, 8, 2, 8, 12
# Hash routing fixes each token's experts: tokens 0-3 pick only rank 1's experts (4-7),
# tokens 4-7 only rank 0's (0-3), tokens 8-11 one of each.
TID2EID = torch.tensor([[4, 5], [6, 7], [5, 7], [4, 6], [0, 1], [2, 3], [1, 3], [0, 2],
                        [0, 4], [7, 3], [5, 1], [2, 6]])
# name -> token ids of one step.
CASES = {
    "every expert on the other rank": [0, 1, 2, 4, 5],
    "no token only on rank 0": [8, 9, 10, 0, 3],
    "no token only on rank 1": [4, 6, 11, 9],
    "one token": [9],
    "two tokens": [11, 2],
}


def moe_config() -> DeepseekV4Config:
    return DeepseekV4Config.from_dict({
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": 1,
        "num_attention_heads": 2, "head_dim": 16, "q_lora_rank": 8, "o_groups": 2,
        "o_lora_rank": 8, "sliding_window": 8, "layer_types": ["sliding_attention"],
        "mlp_layer_types": ["hash_moe"], "n_routed_experts": EXPERTS,
        "num_experts_per_tok": TOP_K, "moe_intermediate_size": INTER,
        "routed_scaling_factor": 1.5, "swiglu_limit": 1.0, "index_n_heads": 2,
        "index_head_dim": 8, "index_topk": 2, "hc_mult": 2, "hc_sinkhorn_iters": 4,
        "hc_eps": 1e-6, "max_position_embeddings": 64})


def moe_weights(hashed: bool) -> MoEWeights:
    """One layer's MoE with random weights (the same in every process)."""
    g = torch.Generator().manual_seed(7)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g) * 0.5

    return MoEWeights(gate=randn(EXPERTS, HIDDEN), bias=None if hashed else randn(EXPERTS),
                      tid2eid=TID2EID if hashed else None,
                      gate_up=randn(EXPERTS, 2 * INTER, HIDDEN), down=randn(EXPERTS, HIDDEN, INTER),
                      shared_gate_up=randn(2 * INTER, HIDDEN), shared_down=randn(HIDDEN, INTER))


def local_weights(w: MoEWeights, shard: DeepseekV4Shard) -> MoEWeights:
    """The rank's experts whole and its rows of the shared expert ([gate; up] rows, down
    columns), as the loader cuts them."""
    assert isinstance(w.gate_up, torch.Tensor) and w.down is not None
    experts, rows = shard.experts, shard.shared
    gate, up = w.shared_gate_up.chunk(2)
    return MoEWeights(w.gate, w.bias, w.tid2eid, w.gate_up[experts.start:experts.stop],
                      w.down[experts.start:experts.stop],
                      torch.cat([gate[rows.start:rows.stop], up[rows.start:rows.stop]]),
                      w.shared_down[:, rows.start:rows.stop])


def case_inputs(token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(x [T, H], token ids [T]) of a case."""
    g = torch.Generator().manual_seed(len(token_ids) * 100 + token_ids[0])
    return torch.randn(len(token_ids), HIDDEN, generator=g), torch.tensor(token_ids)


def run_rank(rank: int, store: str, conn: multiprocessing.connection.Connection) -> None:
    """Rank `rank` of 2: every case, with hash routing and with score routing; sends
    {(case, hashed): output [T, H]} on `conn`."""
    torch.set_num_threads(1)
    group = TorchTensorParallelGroup(rank, 2, torch.device("cpu"), Path(store), 30.0)
    try:
        cfg = moe_config()
        shard = DeepseekV4Shard.of(cfg, rank, 2, expert_parallel=True)
        out = {}
        for hashed in (True, False):
            w = local_weights(moe_weights(hashed), shard)
            for name, ids in CASES.items():
                x, token_ids = case_inputs(ids)
                part = moe_forward(x, token_ids, w, cfg, experts=shard.experts)
                out[name, hashed] = group.all_reduce(part)
        # As numpy: a pickled tensor passes a file descriptor that the receiver must fetch
        # from this process, which may have exited by then.
        conn.send({key: t.numpy() for key, t in out.items()})
    finally:
        group.close()
