"""openinfer-kvcache: paged KV cache buffer, block pool and per-request block tables."""

from openinfer_kvcache.block_pool import PADDING_BLOCK, BlockPool
from openinfer_kvcache.buffer import KVBuffer
from openinfer_kvcache.manager import PagedKVManager
from openinfer_kvcache.spec import DEFAULT_BLOCK_SIZE, KVCacheSpec

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "PADDING_BLOCK",
    "BlockPool",
    "KVBuffer",
    "KVCacheSpec",
    "PagedKVManager",
]
