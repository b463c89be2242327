"""The disk store when the disk will not serve: a directory it cannot write is a start-up error
naming the path and the cause; a disk that fails later (full, EIO) turns the tier off with one
ERROR line, and what it held becomes misses."""

from __future__ import annotations

import errno
import io
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from offload_fixtures import block, read, store_at

from openinfer_core.errors import InvalidParameterError
from openinfer_offload import disk

LOGGER = "openinfer.offload"


def bad_directory(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A directory of `kind` the tier cannot write, and the cause its error must name."""
    if kind == "a regular file":
        path = tmp_path / "file"
        path.write_text("not a directory")
        return path, os.strerror(errno.ENOTDIR)
    if kind == "under a regular file":
        (tmp_path / "file").write_text("not a directory")
        return tmp_path / "file" / "kv", os.strerror(errno.ENOTDIR)
    if kind == "under /proc":  # procfs refuses new entries, to root too
        return Path("/proc/openinfer-kv-test"), os.strerror(errno.ENOENT)
    if kind == "under /sys":  # as does sysfs
        return Path("/sys/openinfer-kv-test"), ""
    if kind == "read-only":
        path = tmp_path / "ro"
        path.mkdir()
        if os.geteuid() != 0:
            path.chmod(0o555)
            return path, os.strerror(errno.EACCES)
        # Root writes through any mode bits: the read-only file system it would meet is
        # injected into the probe instead.
        fail_opens(monkeypatch, "w", errno.EROFS)
        return path, os.strerror(errno.EROFS)
    raise AssertionError(kind)


def fail_opens(monkeypatch: pytest.MonkeyPatch, mode: str, code: int,
               when: Callable[[], bool] = lambda: True) -> None:
    """The disk module's `open` in `mode` ("w" or "r") gives a file whose every write or read
    raises OSError(`code`) (while `when()`); other opens are real."""
    real_open = open

    def opened(path: Any, how: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(path, how, *args, **kwargs)
        return Failing(f, code) if mode in how and when() else f

    monkeypatch.setattr(disk, "open", opened, raising=False)


class Failing(io.RawIOBase):
    """A file whose reads and writes fail with one errno."""

    def __init__(self, f: Any, code: int) -> None:
        self._f, self._code = f, code

    def _fail(self, *_: object) -> Any:
        raise OSError(self._code, os.strerror(self._code), self._f.name)

    write = read = readinto = _fail

    def close(self) -> None:
        self._f.close()
        super().close()


@pytest.mark.parametrize("kind", ["a regular file", "under a regular file", "under /proc",
                                  "under /sys", "read-only"])
def test_a_directory_it_cannot_write_is_a_start_up_error(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, cause = bad_directory(kind, tmp_path, monkeypatch)
    with pytest.raises(InvalidParameterError) as raised:
        store_at(path)
    message = str(raised.value)
    assert raised.value.param == "kv_offload_disk_dir"
    assert f"cannot write in {path}" in message and cause in message, message
    assert "give --kv-offload-disk-dir a writable directory" in message


def test_a_read_only_file_system_is_a_start_up_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """What a directory on a read-only mount gives, injected: root can test it too."""
    real_open = open

    def read_only(path: Any, how: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in how:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, how, *args, **kwargs)

    monkeypatch.setattr(disk, "open", read_only, raising=False)
    with pytest.raises(InvalidParameterError, match=r"Read-only file system \(EROFS\)"):
        store_at(tmp_path / "kv")


def test_the_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    store = store_at(tmp_path / "kv")
    assert [p.name for p in (tmp_path / "kv").iterdir()] == ["f00d"]
    assert not list(store.root.iterdir())


def error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno >= logging.ERROR]


def test_a_full_disk_turns_the_tier_off(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_at(tmp_path)
    store.put(9, block(9))
    fail_opens(monkeypatch, "w", errno.ENOSPC)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        with ThreadPoolExecutor(4) as pool:  # as the host tier's I/O threads write
            list(pool.map(lambda k: store.put(k, block(k)), range(1, 9)))
        store.put(20, block(20))
    (line,) = error_lines(caplog)
    assert "turned off" in line and os.strerror(errno.ENOSPC) in line and str(store.root) in line
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    stats = store.stats()
    assert stats.disabled and stats.used_blocks == 0 and stats.saved == 1
    assert not any(store.contains(k) for k in (1, 9, 20))
    monkeypatch.undo()  # the disk works again: the tier stays off for the run
    store.put(21, block(21))
    assert read(store, 9) is None and read(store, 21) is None
    assert not list(tmp_path.rglob("*.tmp"))
    again = store_at(tmp_path)  # the next run finds what was written before the failure
    assert read(again, 9) == block(9).tobytes() and not again.stats().disabled


def test_a_read_error_turns_the_tier_off(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_at(tmp_path)
    for key in (1, 2, 3):
        store.put(key, block(key))
    fail_opens(monkeypatch, "r", errno.EIO)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert read(store, 1) is None
        assert read(store, 2) is None
        store.put(4, block(4))
    (line,) = error_lines(caplog)
    assert "turned off" in line and "reading" in line and os.strerror(errno.EIO) in line
    assert store.stats().disabled and not store.contains(3) and not store.contains(4)
    assert len(list(tmp_path.rglob("*.kv"))) == 3  # files are kept for a later run
