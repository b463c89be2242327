"""Which part of DeepSeek-V4 one tensor-parallel rank holds (spec: shared deepseek-v4.md §9,
the official MP split, with the indexer replicated and the experts' choice below):

- attention over query heads, whole output groups per rank: `wq_b` rows and `attn_sink` of
  the rank's heads, `wo_a` rows of its groups, `wo_b` columns of its groups (partial sums,
  all-reduced). The one shared KV head (`wkv`, `kv_norm`), `wq_a`, the compressors and the
  indexer are replicated, so each rank keeps the whole KV cache: the indexer's 64 heads cost
  a top-k over all-reduced scores per layer if split, and its weights are small (a prompt
  step splits its work by token instead: `paged_attention.py`);
- routed experts: split by width (each expert's `w1`/`w3` rows and `w2` columns: partial
  sums, all-reduced with the shared expert's, split the same way), or with expert
  parallelism whole, experts [first, last) per rank (`expert_parallel.py`: each rank's own
  experts' part of the sum, all-reduced the same way), the shared expert split by width in
  either case;
- embedding and head by vocabulary rows (a masked lookup + all-reduce, an all-gather of the
  logits), as the Qwen3 line; router, hash tables, norms and hyper-connections replicated.

Splits are contiguous and as even as `openinfer_core.distributed.sharding.split_range`
makes them (earlier ranks take the larger parts): uneven counts cost balance, not
correctness."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from openinfer_core.distributed.sharding import VocabShard, split_range, vocab_shard
from openinfer_core.errors import ModelConfigError
from openinfer_deepseek_v4.config import DeepseekV4Config


@dataclass(frozen=True, slots=True)
class DeepseekV4Shard:
    """Rank `rank` of `size`; `of(cfg)` (rank 0 of 1) holds everything."""

    rank: int
    size: int
    groups: range  # the output projection's groups
    heads: range  # their query heads (heads // groups per group)
    expert_parallel: bool
    # First routed expert of each rank, then num_experts ((0, num_experts) without expert
    # parallelism: every rank holds a part of each).
    expert_starts: tuple[int, ...]
    intermediate: range  # rows of each held routed expert (expert parallel: all of them)
    shared: range  # rows of the shared expert
    vocab: VocabShard

    @classmethod
    def of(cls, cfg: DeepseekV4Config, rank: int = 0, size: int = 1,
           expert_parallel: bool = False) -> DeepseekV4Shard:
        """Raises `ModelConfigError` when a rank would get no output group (or, with expert
        parallelism, no expert)."""
        if size > cfg.o_groups:
            raise ModelConfigError(
                f"tensor_parallel_size {size} is more than o_groups ({cfg.o_groups}): each rank "
                f"takes whole output groups of heads; use at most {cfg.o_groups} ranks")
        if expert_parallel and size > cfg.num_experts:
            raise ModelConfigError(
                f"--enable-expert-parallel over {size} ranks needs as many routed experts, the "
                f"model has {cfg.num_experts}")
        groups = split_range(cfg.o_groups, size, rank)
        per_group = cfg.num_heads // cfg.o_groups
        experts = ([split_range(cfg.num_experts, size, r).start for r in range(size)]
                   if expert_parallel else [0])
        shared = cfg.moe_intermediate_size * cfg.num_shared_experts
        whole = range(cfg.moe_intermediate_size)
        return cls(rank, size, groups, range(groups.start * per_group, groups.stop * per_group),
                   expert_parallel, (*experts, cfg.num_experts),
                   whole if expert_parallel else split_range(len(whole), size, rank),
                   split_range(shared, size, rank),
                   vocab_shard(cfg.vocab_size, rank, size))

    @property
    def experts(self) -> range:
        """The routed experts this rank holds (all of them without expert parallelism)."""
        if not self.expert_parallel:
            return range(self.expert_starts[-1])
        return range(self.expert_starts[self.rank], self.expert_starts[self.rank + 1])

    def local_config(self, cfg: DeepseekV4Config) -> DeepseekV4Config:
        """`cfg` with the rank's heads and output groups: what its attention computes."""
        return dataclasses.replace(cfg, num_heads=len(self.heads), o_groups=len(self.groups))
