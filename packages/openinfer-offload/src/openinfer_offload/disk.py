"""The `disk` store: one file per block under `<kv_offload_disk_dir>/<fingerprint>/`, LRU-bounded
by `kv_offload_disk_gib`, kept across restarts.

A file is a 32-byte header (magic, format version, key, payload length, CRC-32 of the payload)
and the block's bytes. It is written to a temporary name and renamed into place, so a reader
never sees half a file under a real name; a file that fails any check on reading (torn, short,
bit-flipped, another key) is deleted and counts as a miss, as is one deleted behind its back.

At start the directory is probed by creating and removing a file in it: a directory that cannot
be written (read-only, a regular file, under /proc, no permission) is a start-up error naming the
path and the cause. Any other I/O error later (disk full, EIO on a write or a read) turns the
tier off for the rest of the run, with one ERROR line and `TierStats.disabled` set (the
`openinfer:kv_offload_tier_disabled` gauge): from then on it holds nothing and takes nothing,
reads in flight are misses, and serving goes on from the tiers above it."""

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
PROBE = ".probe"


def probe_directory(root: Path) -> None:
    """Create `root` (and its parents) and a file in it, then remove the file; raises
    `InvalidParameterError` naming the path and the cause when any of it fails."""
    probe = root / f"{PROBE}.{os.getpid()}.{threading.get_ident()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0")
        probe.unlink()
    except OSError as error:
        cause = error.strerror or str(error) or type(error).__name__
        code = errno.errorcode.get(error.errno or 0)
        where = f"{error.filename}: " if error.filename and str(error.filename) != str(root) \
            else ""
        raise InvalidParameterError("kv_offload_disk_dir", (
            f"the KV disk tier cannot write in {root}: {where}{cause}"
            + (f" ({code})" if code else "") + "; give --kv-offload-disk-dir a writable "
            "directory, or leave disk out of --kv-offload")) from None


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
        self.disabled = False  # set once, by the first I/O error after start
        self.hits = self.saved = 0
        self.bytes_in = self.bytes_out = 0
        probe_directory(self.root)
        self._scan()

    def _path(self, key: int) -> Path:
        name = f"{key:016x}"
        return self.root / name[:2] / (name + SUFFIX)

    def _scan(self) -> None:
        """Rebuild the index from the files a previous run left, oldest use first."""
        found: list[tuple[float, int]] = []
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
        if self.disabled or self.contains(key):
            return
        path = self._path(key)
        tmp = path.with_suffix(f"{SUFFIX}.{threading.get_ident()}.tmp")
        header = HEADER.pack(MAGIC, VERSION, key, len(data), zlib.crc32(data))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(data)
            os.replace(tmp, path)
        except OSError as error:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self._disable("writing", path, error)
            return
        with self._lock:
            if self.disabled:
                return
            self._lru[key] = None
            self.saved += 1
            self.bytes_in += self.file_bytes
            self._evict()

    def get(self, key: int, out: memoryview) -> bool:
        if self.disabled:
            return False
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                header = f.read(HEADER.size)
                got = f.readinto(out)
                extra = f.read(1)
        except FileNotFoundError:  # deleted behind its back: a miss
            self._forget(key)
            return False
        except OSError as error:
            self._disable("reading", path, error)
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
                             len(self._lru), self.capacity_blocks, self.disabled)

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

    def _disable(self, doing: str, path: Path, error: OSError) -> None:
        """Turn the tier off for the rest of the run: one ERROR line (the first failure of
        any I/O thread), the index emptied (the files stay for a later run)."""
        with self._lock:
            if self.disabled:
                return
            self.disabled = True
            self._lru.clear()
        log.error("KV disk tier %s turned off for the rest of the run: %s %s failed (%s); "
                  "serving goes on from host memory, the blocks it held are recomputed",
                  self.root, doing, path, error)
