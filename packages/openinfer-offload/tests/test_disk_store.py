"""The disk store: round trips, a restart, files that are corrupt, torn, missing or foreign,
and the LRU bound. Directories it cannot write and disks that fail later: disk_failures.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from offload_fixtures import block, context, fake_kv, read, store_at

from openinfer_core.errors import InvalidParameterError
from openinfer_core.interfaces.offload import BlockStore
from openinfer_offload.disk import HEADER, DiskStore


def test_round_trip_and_restart(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    assert isinstance(store, BlockStore)
    for key in (1, 2, 0xFFFF_FFFF_FFFF_FFFF):
        store.put(key, block(key % 97))
    assert read(store, 2) == block(2).tobytes()
    assert read(store, 3) is None
    again = store_at(tmp_path)  # a new process on the same directory and model
    assert all(again.contains(k) for k in (1, 2, 0xFFFF_FFFF_FFFF_FFFF))
    assert read(again, 0xFFFF_FFFF_FFFF_FFFF) == block(0xFFFF_FFFF_FFFF_FFFF % 97).tobytes()
    other_model = store_at(tmp_path, fingerprint="beef")
    assert not other_model.contains(1) and read(other_model, 1) is None


def files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.kv"))


@pytest.mark.parametrize("damage", ["flip-a-payload-bit", "truncate", "append", "other-key",
                                    "empty"])
def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path: Path, damage: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    store = store_at(tmp_path)
    store.put(7, block(7))
    store.put(8, block(8))
    path = next(p for p in files(tmp_path) if p.stem == f"{7:016x}")
    data = bytearray(path.read_bytes())
    if damage == "flip-a-payload-bit":
        data[HEADER.size + 100] ^= 0x10
    elif damage == "truncate":
        data = data[:-1]
    elif damage == "append":
        data += b"\\0"
    elif damage == "other-key":
        data[:HEADER.size] = next(p for p in files(tmp_path) if p != path).read_bytes()[
            :HEADER.size]
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="openinfer.offload"):
        assert read(store, 7) is None
    assert "dropped" in caplog.text
    assert not path.exists() and not store.contains(7)
    assert read(store, 8) == block(8).tobytes()  # the neighbour is untouched


def test_a_torn_file_from_a_crash_is_ignored_at_start(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.put(5, block(5))
    path = files(tmp_path)[0]
    path.write_bytes(path.read_bytes()[:1000])  # a short file under a real name
    tmp = path.with_name(path.name + ".123.tmp")
    tmp.write_bytes(b"partial")
    again = store_at(tmp_path)
    assert not again.contains(5) and not path.exists() and not tmp.exists()


def test_a_file_deleted_behind_its_back_is_a_miss(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.put(5, block(5))
    files(tmp_path)[0].unlink()
    assert store.contains(5)  # the index cannot know
    assert read(store, 5) is None and not store.contains(5)
    assert not store.stats().disabled  # a miss, not a failing disk


def test_lru_bound_keeps_the_recently_read(tmp_path: Path) -> None:
    store = store_at(tmp_path, disk_blocks=3)
    for key in (1, 2, 3):
        store.put(key, block(key))
    assert read(store, 1) is not None  # 1 is now the most recently used
    store.put(4, block(4))
    assert [store.contains(k) for k in (1, 2, 3, 4)] == [True, False, True, True]
    assert len(files(tmp_path)) == 3
    assert store.stats().used_blocks == 3


def test_restart_keeps_the_lru_order_and_the_bound(tmp_path: Path) -> None:
    store = store_at(tmp_path, disk_blocks=4)
    for i, key in enumerate((1, 2, 3, 4)):
        store.put(key, block(key))
        os.utime(files(tmp_path)[0].parent / f"{key:016x}.kv", (1000 + i, 1000 + i))
    again = store_at(tmp_path, disk_blocks=2)  # a smaller bound: the oldest two go
    assert [again.contains(k) for k in (1, 2, 3, 4)] == [False, False, True, True]


def test_disk_tier_needs_a_directory() -> None:
    with pytest.raises(InvalidParameterError, match="--kv-offload-disk-dir"):
        DiskStore(context(fake_kv()))
