"""DeepSeek-V4's lightning indexer: the reference ops. No Triton kernel yet."""

from openinfer_kernels.indexer.reference import indexer_scores_ref, indexer_topk_ref

__all__ = ["indexer_scores_ref", "indexer_topk_ref"]
