"""The `disk` store: one file per block under `<kv_offload_disk_dir>/<fingerprint>/`, LRU-bounded
by `kv_offload_disk_gib`, kept across restarts.

A file is a 32-byte header (magic, format version, key, payload length, CRC-32 of the payload)
and the block's bytes. It is written to a temporary name and renamed into place, so a reader
never sees half a file under a real name; a file that fails any check on reading (torn, short,
bit-flipped, another key) is deleted and counts as a miss. Writes that fail (disk full, read-only,
permissions) are logged once per cause and dropped."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
import zlib
from collections import OrderedDict
from pathlib import Path

from openinfer_core.errors import InvalidParameterError
from openinfer_core.interfaces.offload import OffloadContext, TierStats

log = logging.getLogger("openinfer.offload")

MAGIC = b"OIKV"
VERSION = 1
HEADER = struct.Struct("<4sIQQI4x")  # magic, version, key, payload bytes, crc32, padding
SUFFIX = ".kv"


class DiskStore:
    """Registered as `disk`; needs `kv_offload_disk_dir`."""

    name = "disk"

    def __init__(self, context: OffloadContext) -> None:
        config = context.config
        if not config.kv_offload_disk_dir:
            raise InvalidParameterError(
                "kv_offload_disk_dir", "the disk tier needs a directory: --kv-offload-disk-dir")
        self.root = Path(config.kv_offload_disk_dir) / context.fingerprint
        self.block_bytes = context.block_bytes
        self.file_bytes = HEADER.size + self.block_bytes
        self.capacity_blocks = int(config.kv_offload_disk_gib * (1 << 30)) // self.file_bytes
        if self.capacity_blocks < 1:
            raise InvalidParameterError("kv_offload_disk_gib", (
                f"{config.kv_offload_disk_gib} GiB holds no KV block: one block is "
                f"{self.file_bytes / (1 << 20):.2f} MiB"))
        self._lock = threading.Lock()
        self._lru: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._warned: set[str] = set()
        self.hits = self.saved = 0
        self.bytes_in = self.bytes_out = 0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            self._warn(error, "cannot create the KV disk tier's directory")
        self._scan()

    def _path(self, key: int) -> Path:
        name = f"{key:016x}"
        return self.root / name[:2] / (name + SUFFIX)

    def _scan(self) -> None:
        """Rebuild the index from the files a previous run left, oldest use first."""
        found: list[tuple[float, int]] = []
        if not self.root.is_dir():
            return
        for path in self.root.glob(f"??/*{SUFFIX}*"):
            try:
                if path.suffix != SUFFIX:  # a temporary file a crash left behind
                    path.unlink()
                    continue
                stat = path.stat()
                if stat.st_size != self.file_bytes:
                    path.unlink()
                    continue
                found.append((stat.st_mtime, int(path.stem, 16)))
            except (OSError, ValueError):
                continue
        for _, key in sorted(found):
            self._lru[key] = None
        self._evict()
        if found:
            log.info("KV disk tier %s: %d blocks from earlier runs", self.root, len(self._lru))

    # -- BlockStore ---------------------------------------------------------------------------
    def contains(self, key: int) -> bool:
        with self._lock:
            return key in self._lru

    def put(self, key: int, data: memoryview) -> None:
        if self.contains(key):
            return
        path = self._path(key)
        tmp = path.with_suffix(f"{SUFFIX}.{threading.get_ident()}.tmp")
        header = HEADER.pack(MAGIC, VERSION, key, len(data), zlib.crc32(data))
        try:
            path.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(data)
            os.replace(tmp, path)
        except OSError as error:
            self._warn(error, "cannot write a KV block to disk; blocks that do not fit are "
                              "recomputed")
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return
        with self._lock:
            self._lru[key] = None
            self.saved += 1
            self.bytes_in += self.file_bytes
            self._evict()

    def get(self, key: int, out: memoryview) -> bool:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                header = f.read(HEADER.size)
                got = f.readinto(out)
                extra = f.read(1)
        except OSError:
            self._forget(key)
            return False
        if len(header) != HEADER.size or got != len(out) or extra:
            return self._reject(key, path, "has the wrong size")
        magic, version, stored_key, length, crc = HEADER.unpack(header)
        if (magic, version, stored_key, length) != (MAGIC, VERSION, key, len(out)):
            return self._reject(key, path, "has a foreign header")
        if zlib.crc32(out) != crc:
            return self._reject(key, path, "fails its checksum")
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
            self.hits += 1
            self.bytes_out += self.file_bytes
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU order a restart rebuilds
        return True

    def stats(self) -> TierStats:
        with self._lock:
            return TierStats(self.name, self.hits, self.saved, self.bytes_in, self.bytes_out,
                             len(self._lru), self.capacity_blocks)

    def close(self) -> None:
        pass

    # -- internals ----------------------------------------------------------------------------
    def _evict(self) -> None:
        """Drop the least recently used files past capacity (lock held)."""
        while len(self._lru) > self.capacity_blocks:
            key, _ = self._lru.popitem(last=False)
            with contextlib.suppress(OSError):
                self._path(key).unlink()

    def _forget(self, key: int) -> None:
        with self._lock:
            self._lru.pop(key, None)

    def _reject(self, key: int, path: Path, why: str) -> bool:
        log.warning("KV disk tier: %s %s; dropped (the block is recomputed)", path, why)
        self._forget(key)
        with contextlib.suppress(OSError):
            path.unlink()
        return False

    def _warn(self, error: OSError, what: str) -> None:
        cause = errno.errorcode.get(error.errno or 0, type(error).__name__)
        if cause not in self._warned:
            self._warned.add(cause)
            log.warning("KV disk tier %s: %s (%s)", self.root, what, error)
