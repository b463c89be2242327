"""The host tier over a CPU stand-in KV cache: byte-exact round trips, leases, LRU reuse, a
full pool, and write-through to a store beneath it."""

from __future__ import annotations

import threading

import pytest
import torch
from offload_fixtures import NUM_BLOCKS, FakeKV, context, fake_kv

from openinfer_core.errors import InvalidParameterError
from openinfer_core.interfaces.offload import OffloadTier, TierStats
from openinfer_offload.host import HostTier


def wait(transfer) -> None:  # type: ignore[no-untyped-def]
    for _ in range(10_000):
        if transfer.poll():
            return
        threading.Event().wait(0.001)
    raise AssertionError("transfer never landed")


def test_round_trip_is_byte_exact_into_other_blocks() -> None:
    kv = fake_kv()
    tier = HostTier(context(kv))
    assert isinstance(tier, OffloadTier)
    wait(tier.save([101, 102, 103], [3, 7, 5]))
    expected = [kv.block(b).clone() for b in (3, 7, 5)]
    for t in kv.tensors:  # the device copies are gone
        t.zero_()
    lease = tier.query([101, 102, 103, 104])
    assert lease.num_blocks == 3
    load = tier.load(lease, [9, 2, 4])
    wait(load)
    assert load.num_blocks == 3
    tier.release(lease)
    for b, want in zip((9, 2, 4), expected, strict=True):
        assert torch.equal(kv.block(b), want)
    assert kv.block(1).abs().sum() == 0  # nothing else written
    own = tier.stats()[0]
    assert (own.hits, own.saved, own.used_blocks) == (3, 3, 3)


def test_query_is_a_run_from_the_first_hash() -> None:
    kv = fake_kv()
    tier = HostTier(context(kv))
    wait(tier.save([1, 2, 4], [1, 2, 3]))
    assert tier.query([1, 2, 3, 4]).num_blocks == 2
    assert tier.query([3, 4]).num_blocks == 0
    assert tier.query([]).num_blocks == 0


def test_lru_reuse_spares_leased_and_recently_used_slots() -> None:
    kv = fake_kv()
    tier = HostTier(context(kv, host_blocks=3))
    wait(tier.save([1, 2, 3], [1, 2, 3]))
    lease = tier.query([1])  # 1 is leased: it must survive
    tier.save([2], [2])  # already there: only marks 2 as recently used
    wait(tier.save([4], [4]))  # the pool is full: 3, the least recently used free one, goes
    assert tier.query([3]).num_blocks == 0
    for key in (1, 2, 4):
        found = tier.query([key])
        assert found.num_blocks == 1
        tier.release(found)
    wait(tier.save([5, 6], [5, 6]))  # only two slots can be reused: 2 and 4 (1 is leased)
    assert tier.query([1]).num_blocks == 1
    assert (tier.query([5]).num_blocks, tier.query([6]).num_blocks) == (1, 1)
    tier.release(lease)


def test_a_pool_of_leased_slots_drops_new_blocks() -> None:
    kv = fake_kv()
    tier = HostTier(context(kv, host_blocks=2))
    wait(tier.save([1, 2], [1, 2]))
    lease = tier.query([1, 2])
    save = tier.save([3], [3])
    wait(save)
    assert save.num_blocks == 0
    assert tier.query([3]).num_blocks == 0
    tier.release(lease)
    wait(tier.save([3], [3]))
    assert tier.query([3]).num_blocks == 1


def test_a_pool_smaller_than_a_block_is_refused() -> None:
    kv = fake_kv()
    with pytest.raises(InvalidParameterError, match="holds no KV block"):
        HostTier(context(kv, host_blocks=0.5))


class SlowStore:
    """A store whose reads wait for `gate`; counts what it is given."""

    name = "slow"

    def __init__(self) -> None:
        self.data: dict[int, bytes] = {}
        self.gate = threading.Event()
        self.fail: set[int] = set()

    def contains(self, key: int) -> bool:
        return key in self.data

    def put(self, key: int, data: memoryview) -> None:
        self.data[key] = bytes(data)

    def get(self, key: int, out: memoryview) -> bool:
        self.gate.wait(10)
        if key in self.fail:
            return False
        out[:] = self.data[key]
        return True

    def stats(self) -> TierStats:
        return TierStats(self.name, saved=len(self.data))

    def close(self) -> None:
        pass


def written(tier: HostTier, store: SlowStore, n: int) -> None:
    for _ in range(10_000):
        tier.save([], [])  # reaps finished writes
        if len(store.data) >= n:
            return
        threading.Event().wait(0.001)
    raise AssertionError("writes never reached the store")


def test_blocks_written_through_come_back_from_the_store() -> None:
    kv = fake_kv()
    store = SlowStore()
    tier = HostTier(context(kv, host_blocks=2), [store])
    wait(tier.save([1, 2], [1, 2]))
    written(tier, store, 2)
    expected = [kv.block(1).clone(), kv.block(2).clone()]
    wait(tier.save([3, 4], [3, 4]))  # evicts 1 and 2 from host memory
    written(tier, store, 4)
    lease = tier.query([1, 2, 3])  # 1, 2 from the store; 3 is in host memory but the run
    assert lease.num_blocks == 2   # needs slots the store's blocks take: 3 and 4 are reused
    load = tier.load(lease, [8, 9])
    assert not load.poll()  # the store's reads wait for the gate
    assert not load.stream_wait()  # nothing to chain on yet: the host still has work
    store.gate.set()
    wait(load)
    tier.release(lease)
    assert torch.equal(kv.block(8), expected[0]) and torch.equal(kv.block(9), expected[1])
    hits = {s.name: s.hits for s in tier.stats()}
    assert hits == {"host": 0, "slow": 2}
    assert tier.query([1, 2]).num_blocks == 2  # promoted into host memory


def test_a_failed_store_read_ends_the_run_there() -> None:
    kv = fake_kv()
    store = SlowStore()
    store.gate.set()
    tier = HostTier(context(kv, host_blocks=3), [store])
    wait(tier.save([1, 2, 3], [1, 2, 3]))
    written(tier, store, 3)
    wait(tier.save([7, 8, 9], [7, 8, 9]))  # 1, 2, 3 leave host memory
    written(tier, store, 6)
    store.fail.add(2)
    lease = tier.query([1, 2, 3])
    assert lease.num_blocks == 3
    load = tier.load(lease, [4, 5, 6])
    wait(load)
    assert load.num_blocks == 1
    tier.release(lease)
    assert tier.query([1]).num_blocks == 1
    assert tier.stats()[1].hits == 1


def test_close_waits_for_writes() -> None:
    kv = fake_kv()
    store = SlowStore()
    tier = HostTier(context(kv, host_blocks=NUM_BLOCKS), [store])
    blocks = list(range(1, NUM_BLOCKS))
    wait(tier.save([100 + b for b in blocks], blocks))
    tier.close()
    assert sorted(store.data) == [100 + b for b in blocks]
    assert all(store.data[100 + b] == kv.block(b).numpy().tobytes() for b in blocks)


def test_evict_all_spares_leased_blocks() -> None:
    kv = fake_kv()
    tier = HostTier(context(kv))
    wait(tier.save([1, 2, 3], [1, 2, 3]))
    lease = tier.query([2])
    tier.evict_all()
    assert [tier.query([k]).num_blocks for k in (1, 3)] == [0, 0]
    assert tier.query([2]).num_blocks == 1
    tier.release(lease)
    assert tier.slots.num_used == 1


@pytest.mark.gpu
def test_work_queued_after_stream_wait_sees_the_restored_blocks() -> None:
    """No host poll: the compute stream itself waits for the copy (256 MiB, long enough that
    a read racing it would see the zeros)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    tensors = [torch.randn((16, 1024, 1024), generator=g, device="cuda") for _ in range(2)]
    kv = FakeKV(tensors)
    tier = HostTier(context(kv, host_blocks=16))
    wait(tier.save(list(range(100, 116)), list(range(16))))
    expected = [kv.block(b).clone() for b in range(16)]
    for _ in range(3):
        for t in tensors:
            t.zero_()
        lease = tier.query(list(range(100, 116)))
        load = tier.load(lease, list(range(16)))
        assert load.stream_wait() and load.num_blocks == 16
        got = [kv.block(b).clone() for b in range(16)]  # queued on the current stream
        wait(load)
        tier.release(lease)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
