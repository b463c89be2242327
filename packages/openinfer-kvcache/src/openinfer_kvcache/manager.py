"""Per-request block tables over one `BlockPool`, with a prefix cache that offload tiers can
save and restore: the `KVManager` and `OffloadableKV` protocols of openinfer-core."""

from __future__ import annotations

from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_kvcache.grouped_manager import GroupedKVManager, blocks_for

__all__ = ["FULL_GROUP", "PagedKVManager", "blocks_for"]

FULL_GROUP = KVGroupSpec("full")


class PagedKVManager(GroupedKVManager):
    """The one-group case of `GroupedKVManager`: each request owns a list of blocks covering
    its tokens; blocks found in the prefix cache are shared (reference counted) with the
    requests that computed them. Engine thread only."""

    def __init__(self, num_blocks: int, block_size: int,
                 enable_prefix_caching: bool = True) -> None:
        super().__init__((FULL_GROUP,), (num_blocks,), block_size, enable_prefix_caching)
