"""DeepSeek-V4's lightning indexer: which compressed entries each query of a CSA layer attends
to. The Triton kernels on CUDA tensors, the references on CPU.

- `indexer_scores` (q, keys, weights) -> [T, E] fp32, over flat keys;
- `indexer_topk` (scores, positions) -> [T, min(top_k, E)]: the ordered causal top-k (ties to
  the earlier entry, `ordered_topk.py`);
- `indexer_topk_paged` (q, weights, index_pool, block_tables, query_start_loc, positions)
  -> [T, top_k] int32: both, with the keys read from the paged cache through the step's block
  tables (no host sync, fixed output width: CUDA-graph safe); entry numbers, or with
  `as_slots=True` rows of the flattened entry pools, ready for `sparse_sink_attention`."""

from openinfer_deepseek_v4.kernels.indexer.ordered_topk import indexer_topk_ordered_ref
from openinfer_deepseek_v4.kernels.indexer.reference import (
    indexer_scores_ref,
    indexer_topk_paged_ref,
    indexer_topk_ref,
    paged_entry_slots,
    token_requests,
)
from openinfer_kernels.dispatch import by_device, triton_kernels

_kernels = triton_kernels("openinfer_deepseek_v4.kernels.indexer.triton")

indexer_scores = by_device(indexer_scores_ref,
                           None if _kernels is None else _kernels.indexer_scores_triton)
indexer_topk = by_device(indexer_topk_ordered_ref,
                         None if _kernels is None else _kernels.indexer_topk_triton)
indexer_topk_paged = by_device(indexer_topk_paged_ref,
                               None if _kernels is None else _kernels.indexer_topk_paged_triton)

__all__ = ["indexer_scores", "indexer_scores_ref", "indexer_topk", "indexer_topk_ordered_ref",
           "indexer_topk_paged", "indexer_topk_paged_ref", "indexer_topk_ref",
           "paged_entry_slots", "token_requests"]
