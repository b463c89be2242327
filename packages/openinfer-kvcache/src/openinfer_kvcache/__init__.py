"""openinfer-kvcache: paged KV cache buffer, block pool, per-request block tables and the
prefix cache."""

from openinfer_kvcache.block_hash import ROOT_PARENT_HASH, hash_block, hash_blocks
from openinfer_kvcache.block_pool import PADDING_BLOCK, BlockPool
from openinfer_kvcache.buffer import KVBuffer
from openinfer_kvcache.manager import PagedKVManager
from openinfer_kvcache.spec import DEFAULT_BLOCK_SIZE, KVCacheSpec

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "PADDING_BLOCK",
    "ROOT_PARENT_HASH",
    "BlockPool",
    "KVBuffer",
    "KVCacheSpec",
    "PagedKVManager",
    "hash_block",
    "hash_blocks",
]
