"""openinfer-kvcache: paged KV cache buffer, block pool, per-request block tables (in KV
groups) and the prefix cache."""

from openinfer_kvcache.block_hash import ROOT_PARENT_HASH, hash_block, hash_blocks
from openinfer_kvcache.block_pool import PADDING_BLOCK, BlockPool
from openinfer_kvcache.buffer import KVBuffer
from openinfer_kvcache.grouped_manager import GroupedKVManager
from openinfer_kvcache.manager import FULL_GROUP, PagedKVManager
from openinfer_kvcache.spec import DEFAULT_BLOCK_SIZE, KVCacheSpec
from openinfer_kvcache.window_sizing import (
    group_pool_blocks,
    periodic_pool_blocks,
    window_pool_blocks,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "FULL_GROUP",
    "PADDING_BLOCK",
    "ROOT_PARENT_HASH",
    "BlockPool",
    "GroupedKVManager",
    "KVBuffer",
    "KVCacheSpec",
    "PagedKVManager",
    "group_pool_blocks",
    "hash_block",
    "hash_blocks",
    "periodic_pool_blocks",
    "window_pool_blocks",
]
