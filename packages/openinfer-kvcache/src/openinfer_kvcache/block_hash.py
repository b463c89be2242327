"""Prefix-cache keys: a full block's hash chains its parent's hash with its token ids."""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

ROOT_PARENT_HASH = 0  # the parent of a request's first block


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """A 64-bit key for one full block. Stable across processes and runs (Python's `hash` is
    salted per process): the offload tiers store blocks under it."""
    data = array("q", [parent_hash - (1 << 63), *token_ids])
    if sys.byteorder == "big":
        data.byteswap()
    return int.from_bytes(hashlib.blake2b(data.tobytes(), digest_size=8).digest(), "little")


def hash_blocks(token_ids: Sequence[int], block_size: int, parent_hash: int = ROOT_PARENT_HASH,
                start: int = 0) -> list[int]:
    """Hashes of the full blocks of `token_ids` from block index `start`, whose parent (block
    `start - 1`) hashes to `parent_hash`. A partial last block gets none."""
    hashes = []
    for begin in range(start * block_size, len(token_ids) - block_size + 1, block_size):
        parent_hash = hash_block(parent_hash, token_ids[begin:begin + block_size])
        hashes.append(parent_hash)
    return hashes
