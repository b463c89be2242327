"""The KV block manager: which device blocks hold which request's keys and values."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class PrefixCacheStats:
    """Running totals since the manager was made, in tokens: `queries` were looked up in the
    prefix cache (a request's tokens at each admission, re-admissions after preemption
    included), `hits` of them were reused."""

    queries: int = 0
    hits: int = 0


# Slots of a state group's pool in start-up's scratch KV caches (`create_kv_cache` without
# step limits), the padding slot included: a slot holds a whole request's recurrent state
# (megabytes), so a scratch pool never has one per block. Scratch batches give row b the slot
# min(its first block id, SCRATCH_STATE_SLOTS - 1) (`engine.batch.scratch_group_tables`).
SCRATCH_STATE_SLOTS = 9


@dataclass(frozen=True, slots=True)
class KVGroupSpec:
    """One KV group: data a model keeps in its own block pool, with its own block table per
    request. Every token group of a manager has the same block size and the same token
    positions: block i of each holds tokens [i * block_size, (i + 1) * block_size).

    `horizon` None: a full group, every computed token stays readable. An int h >= 0: a window
    group, a token at position p reads the group's entries at positions [p - h, p] only (its
    own and the h before it), so after n computed tokens the request needs [n - h, n) alone
    and the blocks before it are given back. A window of W tokens that includes the reading
    token is horizon W - 1.

    `state` True (horizon None): a state group, not a token group. Each request holds exactly
    one block of its pool, a "slot", from its first `allocate` until `free`, whatever its
    length: a fixed-size recurrent state (a linear-attention layer's), which each step reads
    and overwrites in place. Its table has one entry, the slot id; slot 0 is the padding
    slot, which padding rows read and write. A row whose first new token is at position 0
    starts from a zero state (the model zeroes its slot), any other continues it.

    `period` p > 1 (horizon None): a periodic full group, which holds only what the tokens at
    positions p - 1, 2p - 1, ... leave (one entry per p tokens: a compressed entry made by
    the token closing its window). Its table has a block only at the positions of blocks
    that hold such a token (`holds_block`); the others are the padding block, so with p
    above the block size it holds 1 block in p / block_size. The block holding the token
    that closes window j is in every prefix that includes that token, and its prefix hash
    covers every token the entry depends on."""

    name: str
    horizon: int | None = None
    state: bool = False
    period: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a KV group needs a name")
        if self.horizon is not None and self.horizon < 0:
            raise ValueError(f"KV group {self.name!r}: horizon must be None (full) or >= 0, "
                             f"got {self.horizon}")
        if self.state and self.horizon is not None:
            raise ValueError(f"KV group {self.name!r}: a state group has no horizon, got "
                             f"{self.horizon}")
        if self.period < 1 or (self.period > 1 and not self.is_full):
            raise ValueError(f"KV group {self.name!r}: period must be >= 1, and 1 unless a "
                             f"full group, got {self.period}")

    @property
    def is_full(self) -> bool:
        return self.horizon is None and not self.state

    @property
    def is_window(self) -> bool:
        return self.horizon is not None

    def holds_block(self, index: int, block_size: int) -> bool:
        """Whether block `index` of a request's table is a block of this group (every block
        of a token group but a periodic one's, which keeps those holding a position
        k * period - 1)."""
        return (index + 1) * block_size // self.period > index * block_size // self.period



@dataclass(frozen=True, slots=True)
class KVGroupUsage:
    """One group's pool, in blocks (the padding block excluded; a state group's blocks are its
    slots): `used` held by requests, `free` can be handed out (`cached` ones among them
    evictable), `cached` findable by a prefix hash, held or free."""

    name: str
    total: int
    used: int
    free: int
    cached: int


@dataclass(frozen=True, slots=True)
class KVStepLimits:
    """The scheduler's limits on one step (`EngineConfig.max_num_seqs`,
    `max_num_batched_tokens`): what sizes a window group's pool, since its blocks are held by
    the running requests' recent tokens alone (`openinfer_kvcache.window_pool_blocks`), and a
    state group's, one slot per running request (`max_num_seqs + 1`, padding included)."""

    max_num_seqs: int
    max_num_batched_tokens: int


@runtime_checkable
class KVManager(Protocol):
    """Logical bookkeeping of a paged KV cache. Block 0 is reserved (padding) and never handed
    out. Called only from the engine thread; every method may mutate state unless it says not.

    Prefix cache: `cache_blocks` makes a request's computed full blocks findable, `computed_tokens`
    attaches the longest run of them a new request can reuse, and `free` leaves them findable
    (evictable, least recently freed first) until their memory is handed out again. A manager
    without one answers 0 hits and ignores `cache_blocks`."""

    block_size: int
    # Set by the engine from `EngineConfig.enable_prefix_caching` (False for a model with a
    # state KV group) right after `Model.create_kv_cache`, before any request; False:
    # `computed_tokens` always answers 0.
    enable_prefix_caching: bool

    @property
    def num_total_blocks(self) -> int:
        """Blocks a request can ever use (the padding block excluded). Pure."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now, cached blocks no request holds included. Pure."""
        ...

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one request (0 when the engine is idle, whatever is
        cached). Pure."""
        ...

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        """Lookup and hit totals, for metrics. Pure."""
        ...

    def computed_tokens(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Tokens of `token_ids` whose KV this request can reuse: the longest run of cached
        full blocks from position 0, capped so at least one token is left to compute (0 without
        a prefix cache). Attaches those blocks to the request, which must hold none yet."""
        ...

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's blocks to cover `num_tokens` tokens. All or nothing: returns False
        and changes nothing when not enough blocks are free (cached free blocks count as free;
        taking one evicts it from the prefix cache)."""
        ...

    def cache_blocks(self, request_id: str, token_ids: Sequence[int],
                     num_computed_tokens: int) -> None:
        """The first `num_computed_tokens` of `token_ids` now have KV in the request's blocks:
        every full block among them becomes findable by later `computed_tokens` calls, even
        while this request still runs. Called after each step that computed tokens."""
        ...

    def block_ids(self, request_id: str) -> Sequence[int]:
        """The request's block table, in order. Pure."""
        ...

    def free(self, request_id: str, token_ids: Sequence[int] | None = None) -> None:
        """Release every block of the request (unknown ids are ignored). Cached blocks stay
        findable until reused. `token_ids` is unused: only `cache_blocks` caches, since only
        the scheduler knows which tokens have KV (the last sampled token has none yet)."""
        ...


@runtime_checkable
class GroupedKV(KVManager, Protocol):
    """A `KVManager` whose requests hold one block table per `KVGroupSpec` (`groups`, in the
    model's order), each group in its own pool. The `KVManager` methods keep their meaning and
    speak of the first full group (`block_ids`, the block counts, the prefix cache's hits);
    `allocate` is all or nothing across every group (a request's first one also takes its
    slot in each state group); `cache_blocks` also gives back a window group's blocks no later
    step reads; a prefix hit of n tokens needs, in each window group, the blocks covering
    [n - horizon, n) still cached, and is cut short where they are not.

    A window group's table stays indexed by block position: entries of blocks given back, or
    not attached on a prefix hit, are the padding block 0. Such an entry is never read: a
    token reads only its group's horizon.

    With a state group there is no prefix cache: `computed_tokens` answers 0 and
    `cache_blocks` makes nothing findable. A state is kept only at the request's last
    computed token, so a hit on a cached prefix would come without the state at its end.
    A preempted request is recomputed from position 0 in a new slot."""

    groups: tuple[KVGroupSpec, ...]

    def group_block_ids(self, request_id: str) -> tuple[Sequence[int], ...]:
        """The request's table in every group, in `groups` order: the token groups' all the
        same length, a state group's its one slot (empty before the first `allocate`). Pure."""
        ...

    def group_usage(self) -> tuple[KVGroupUsage, ...]:
        """Each group's pool, in `groups` order. Pure."""
        ...


class SealedBlock(NamedTuple):
    """A block position made findable: its chain hash, and the block holding it in each group
    (`GroupedKV.groups` order; one entry for a plain `KVManager`): None where the group does
    not hold it (a window group's block already given back, a state group)."""

    hash: int
    blocks: tuple[int | None, ...]


@runtime_checkable
class OffloadableKV(KVManager, Protocol):
    """A `KVManager` whose findable blocks can be saved to and restored from offload tiers
    (`interfaces.offload`), group by group. Needed for `--kv-offload`. `group` arguments index
    `GroupedKV.groups` (0 for a plain manager)."""

    def track_sealed(self) -> None:
        """From now on, remember blocks as `cache_blocks` makes them findable."""
        ...

    def take_sealed(self) -> list[SealedBlock]:
        """The block positions made findable since the last call whose full-group block is
        still findable (a request may have freed it since; none was reused), in order. A
        window group's block is named only where the request still held it when it was
        sealed (its horizon reached it) and it is still findable."""
        ...

    def prefix_hashes(self, request_id: str, token_ids: Sequence[int]) -> Iterator[int]:
        """Hashes of the full blocks of `token_ids` a prefix hit may cover (at least one token
        is left to compute), from the first, computed as they are taken (a restore starts
        copying before the whole prompt is hashed). Pure."""
        ...

    def reserve(self, request_id: str, num_tokens: int) -> bool:
        """`allocate` for a restore, in the full groups only (a window group's table grows by
        padding entries: `reserve_window_tail` takes the blocks a restore copies into). The
        request's prefix lookup is not counted as an admission (its admission after the
        restore counts)."""
        ...

    def reserve_window_tail(self, request_id: str, num_tokens: int) -> bool:
        """After `reserve`: in each window group, take blocks for the padding entries that a
        step after `num_tokens` tokens reads (positions [num_tokens - horizon, num_tokens)).
        All or nothing; True without window groups."""
        ...

    def hold(self, block_ids: Sequence[int], group: int = 0) -> None:
        """Add a reference to each findable block of `group`, freed or not (so it is not
        reused while a copy reads it)."""
        ...

    def release(self, block_ids: Sequence[int], group: int = 0) -> None:
        """Drop a reference `hold` added."""
        ...
