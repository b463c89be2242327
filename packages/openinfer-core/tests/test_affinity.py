"""The prefix table the data-parallel router routes by: chained block keys, slots that pack a
key's tag with its holders, sets that keep their newest keys, the longest prefix any of the
given replicas holds, and one table shared by two processes."""

from __future__ import annotations

import multiprocessing
import sys

import pytest

from openinfer_core.ipc.affinity import (
    MAX_REPLICAS,
    WAYS,
    PrefixAffinity,
    SharedAffinity,
    block_keys,
    table_bytes,
)

BLOCK = 4


def _key(i: int) -> int:
    """A key whose tag (top 48 bits) is i's: distinct keys in one set."""
    return i << 40


def _one_set() -> tuple[PrefixAffinity, bytearray]:
    buffer = bytearray(8 * WAYS)
    return PrefixAffinity(buffer), buffer


def _slots(buffer: bytearray) -> list[int]:
    return [int.from_bytes(buffer[i:i + 8], sys.byteorder) for i in range(0, len(buffer), 8)]


def test_block_keys_chain_whole_blocks() -> None:
    ids = list(range(11))
    keys = block_keys(ids, BLOCK)
    assert len(keys) == 2  # the partial third block gets none
    assert block_keys(ids[:8], BLOCK) == keys
    assert block_keys([*ids[:4], 99, *ids[5:]], BLOCK)[1] != keys[1]  # a key stands for its prefix
    assert block_keys(ids[4:8], BLOCK) != keys[1:2]  # the same block after another parent
    assert block_keys(ids[:3], BLOCK) == []


def test_table_size() -> None:
    assert table_bytes(1) == 8 * WAYS
    assert table_bytes(50) == 8 * 128  # twice the blocks, rounded up to a power of two
    assert table_bytes(64) == 8 * 128
    assert PrefixAffinity.in_process(100).capacity == 256
    assert PrefixAffinity(bytearray(8 * 3 * WAYS)).capacity == 2 * WAYS  # a power of two of sets
    with pytest.raises(ValueError, match=">= 1 block"):
        table_bytes(0)
    with pytest.raises(ValueError, match=f">= {8 * WAYS} bytes"):
        PrefixAffinity(bytearray(8))


def test_a_slot_packs_the_tag_with_the_holders() -> None:
    table, buffer = _one_set()
    key = -0x1234_5678_9ABC_DEF0  # a hash may be negative: its unsigned 64 bits are kept
    table.record([key], 3)
    assert _slots(buffer)[0] == ((key % 2**64) >> 16 << 16) | 1 << 3
    table.record([key], 0)
    assert _slots(buffer)[0] == ((key % 2**64) >> 16 << 16) | 1 << 3 | 1
    assert _slots(buffer)[1:] == [0, 0, 0]
    assert table.match([key], [0, 3]) == (0, 1)
    assert table.match([key], [3, 0]) == (3, 1)  # either holds it: the first asked for
    assert table.match([key], [1, 2]) == (None, 0)
    table.record([key], MAX_REPLICAS - 1)
    assert table.match([key], [MAX_REPLICAS - 1]) == (MAX_REPLICAS - 1, 1)
    with pytest.raises(ValueError, match="not in 0..15"):
        table.record([key], MAX_REPLICAS)


def test_the_longest_prefix_any_given_replica_holds() -> None:
    table = PrefixAffinity.in_process(64)
    a, b = block_keys(range(12), BLOCK), block_keys([*range(8), 50, 51, 52, 53], BLOCK)
    table.record(a, 0)
    table.record(b, 1)  # shares two blocks with a: both replicas hold those
    assert table.match(a, [0, 1]) == (0, 3)
    assert table.match(a, [1, 0]) == (0, 3)  # only 0 holds the third block
    assert table.match(b, [0, 1]) == (1, 3)
    assert table.match(a[:2], [1, 0]) == (1, 2)  # both hold it: the first asked for
    assert table.match(b, [0]) == (0, 2)  # replica 1 not asked: 0 holds b's first two
    assert table.match(a, [2]) == (None, 0)
    assert table.match(block_keys(range(100, 112), BLOCK), [0, 1]) == (None, 0)
    assert table.match([a[0], 12345, a[2]], [0, 1]) == (0, 1)  # stops at the first missing
    assert len(table) == 4


def test_a_set_keeps_its_newest_keys() -> None:
    table, _ = _one_set()  # one set: every key collides
    for i in range(1, WAYS + 1):
        table.record([_key(i)], 0)
    assert all(table.match([_key(i)], [0]) == (0, 1) for i in range(1, WAYS + 1))
    table.record([_key(9)], 1)  # a fifth key: the oldest (1) goes
    assert table.match([_key(1)], [0, 1]) == (None, 0)
    assert table.match([_key(9)], [0, 1]) == (1, 1)
    table.record([_key(2)], 1)  # written again: now the newest
    table.record([_key(10)], 1)  # so 3 goes, not 2
    assert [table.match([_key(i)], [0, 1])[1] for i in (2, 3, 4, 9, 10)] == [1, 0, 1, 1, 1]
    assert len(table) == WAYS


def test_a_prompts_root_outlives_its_tail() -> None:
    table, _ = _one_set()
    prompt = [_key(1), _key(2), _key(3)]  # as chained keys: 3 stands for 1 and 2 before it
    table.record(prompt, 0)
    table.record([_key(7), _key(8)], 1)  # two more keys: one of the prompt's goes, its tail
    assert table.match(prompt, [0, 1]) == (0, 2)


# The second process: attaches by name, finds what the first recorded, records its own.
CHILD = """
from openinfer_core.ipc.affinity import SharedAffinity, block_keys
shared = SharedAffinity.attach(NAME)
try:
    assert shared.table.match(block_keys(range(64), 16), [0, 1]) == (1, 4)
    shared.table.record(block_keys(range(100, 164), 16), 0)
finally:
    shared.close()
"""


def test_two_processes_share_one_table() -> None:
    owner = SharedAffinity.create(64)
    try:
        owner.table.record(block_keys(range(64), 16), 1)
        child = multiprocessing.get_context("spawn").Process(
            target=exec, args=(CHILD, {"NAME": owner.name}))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert owner.table.match(block_keys(range(100, 164), 16), [0, 1]) == (0, 4)
        assert owner.table.match(block_keys(range(100, 164), 16), [1]) == (None, 0)
    finally:
        owner.close()
    with pytest.raises(FileNotFoundError):  # the owner's close removed the name
        SharedAffinity.attach(owner.name)
