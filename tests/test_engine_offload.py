"""KV offload end to end on CPU (fp32, exact): re-sent prompts whose KV left a tiny device
cache come back from host memory or disk and give the same greedy tokens as without offload;
the disk tier serves a restarted engine; damaged files are misses; aborts and a long mixed run
leave no block, lease or stale entry behind."""

from __future__ import annotations

import errno
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import sample_plugin
import torch
from engine_helpers import engine_block_bytes, run_staggered, tokens_of

from openinfer_core.engine import offload
from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.engine.request_state import RequestState
from openinfer_core.events import Finished, FinishReason, Scheduled, TokenEvent
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.params import SamplingParams
from openinfer_core.plugins import PluginManager
from openinfer_core.request import GenerateRequest
from openinfer_kvcache import hash_blocks
from openinfer_offload.block_copy.reference import gather_blocks_ref
from openinfer_offload.copier import DeviceCopier
from openinfer_offload.host import HostTier

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SMALL_KV = 14  # blocks (padding included): one 150-token prompt at a time, nothing kept


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 1000) for _ in range(length)] for _ in range(n)]


def engine(model: Path, **kw: object) -> Engine:
    options: dict[str, object] = {"num_kv_blocks": SMALL_KV, **kw}
    return Engine(EngineConfig(model=str(model), device="cpu", **options))  # type: ignore[arg-type]


def gib(blocks: int, model: Path) -> float:
    return blocks * engine_block_bytes(model) / (1 << 30)


def run_twice(e: Engine, batch: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Each prompt, then each again (by then evicted from the device): the second round's
    tokens and cached_tokens."""
    requests = [GenerateRequest(f"r{i}", tuple(p), GREEDY)
                for i, p in enumerate([*batch, *batch])]
    events = run_staggered(e, requests, lambda i: 40 * i)
    second = [events[f"r{i}"] for i in range(len(batch), 2 * len(batch))]
    cached = [next(ev.cached_tokens for ev in evs if isinstance(ev, Scheduled)) for evs in second]
    return [tokens_of(evs) for evs in second], cached


@pytest.fixture(scope="module")
def baseline(qwen3_dir: Path) -> Iterator[dict[int, list[list[int]]]]:
    """Greedy tokens without offload, per prompt set."""
    cache: dict[int, list[list[int]]] = {}
    yield cache


def expected(qwen3_dir: Path, baseline: dict[int, list[list[int]]], seed: int,
             batch: list[list[int]]) -> list[list[int]]:
    if seed not in baseline:
        tokens, cached = run_twice(engine(qwen3_dir), batch)
        assert cached == [0] * len(batch)  # the device cache really is too small to keep them
        baseline[seed] = tokens
    return baseline[seed]


SMALL_PIECES = (2, 3)  # a 9-block prefix comes back in four pieces


@pytest.mark.parametrize("pieces", [offload.PIECES, SMALL_PIECES])
@pytest.mark.parametrize("tiers", [("host",), ("host", "disk")])
def test_restored_prefixes_give_the_same_tokens(qwen3_dir: Path, tmp_path: Path,
                                                baseline: dict[int, list[list[int]]],
                                                tiers: tuple[str, ...],
                                                pieces: tuple[int, ...],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload, "PIECES", pieces)
    batch = prompts(4, 150)
    # With disk, host memory holds 20 blocks (a prompt has 9): most come back from disk.
    host = gib(20 if "disk" in tiers else 200, qwen3_dir)
    e = engine(qwen3_dir, kv_offload=tiers, kv_offload_host_gib=host,
               kv_offload_disk_dir=str(tmp_path))
    tokens, cached = run_twice(e, batch)
    assert tokens == expected(qwen3_dir, baseline, 0, batch)
    assert cached == [144] * 4  # 9 full blocks of the 150 tokens; the last is computed
    stats = e.offload.stats()  # type: ignore[union-attr]
    hits = {t.name: t.hits for t in stats.tiers}
    assert sum(hits.values()) == stats.restored_blocks == 36
    if "disk" in tiers:
        assert hits["disk"] > 0
    assert e.kv.num_used_blocks == 0
    e.close()


def fill_disk(model: Path, disk: Path, batch: list[list[int]]) -> dict[str, object]:
    """Run `batch` through an engine with host and disk tiers on `disk`, then stop it (its
    writes land); returns the options that start another one on the same directory."""
    options: dict[str, object] = dict(kv_offload=("host", "disk"),
                                      kv_offload_host_gib=gib(200, model),
                                      kv_offload_disk_dir=str(disk))
    first = engine(model, **options)
    run_staggered(first, [GenerateRequest(f"a{i}", tuple(p), GREEDY)
                          for i, p in enumerate(batch)], lambda i: 40 * i)
    first.close()
    return options


def test_a_restarted_engine_serves_old_prefixes_from_disk(
        qwen3_dir: Path, tmp_path: Path, baseline: dict[int, list[list[int]]]) -> None:
    batch = prompts(4, 150)
    options = fill_disk(qwen3_dir, tmp_path, batch)
    second = engine(qwen3_dir, **options)
    events = run_staggered(second, [GenerateRequest(f"b{i}", tuple(p), GREEDY)
                                    for i, p in enumerate(batch)], lambda i: 40 * i)
    want = expected(qwen3_dir, baseline, 0, batch)
    assert [tokens_of(events[f"b{i}"]) for i in range(4)] == want
    assert [events[f"b{i}"][0].cached_tokens for i in range(4)] == [144] * 4  # type: ignore[attr-defined]
    disk = {t.name: t for t in second.offload.stats().tiers}["disk"]  # type: ignore[union-attr]
    assert disk.hits == 36
    second.close()


@pytest.mark.parametrize(("failing", "code"), [("w", errno.ENOSPC), ("r", errno.EIO)],
                         ids=["writes-ENOSPC", "reads-EIO"])
def test_a_failing_disk_turns_its_tier_off_and_serving_goes_on(
        qwen3_dir: Path, tmp_path: Path, baseline: dict[int, list[list[int]]], failing: str,
        code: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk full on every write, or EIO on every read of a disk a previous run filled: one
    ERROR line, the tier off (its gauge 1), and every request gives the tokens it gives
    without offload, from host memory or recomputed."""
    from openinfer_core.engine.async_engine import AsyncEngine
    from openinfer_offload import disk
    from openinfer_server.metrics import ServerMetrics

    batch = prompts(4, 150)
    options: dict[str, object] = dict(kv_offload=("host", "disk"),
                                      kv_offload_host_gib=gib(200, qwen3_dir),
                                      kv_offload_disk_dir=str(tmp_path))
    if failing == "r":  # a new engine's host memory is empty: every restore reads the disk
        options = fill_disk(qwen3_dir, tmp_path, batch)
    e = engine(qwen3_dir, **options)
    real_open = open

    def failing_open(path: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if failing in mode:
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(disk, "open", failing_open, raising=False)
    with caplog.at_level(logging.WARNING, logger="openinfer.offload"):
        tokens, _ = run_twice(e, batch)
    assert tokens == expected(qwen3_dir, baseline, 0, batch)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and os.strerror(code) in errors[0], errors
    tiers = {t.name: t for t in e.offload.stats().tiers}  # type: ignore[union-attr]
    assert tiers["disk"].disabled and not tiers["host"].disabled
    assert tiers["disk"].hits == 0 and tiers["disk"].used_blocks == 0
    if failing == "w":
        assert tiers["host"].hits == 36  # the tier above serves on
    handle = AsyncEngine(e)
    try:
        text = ServerMetrics(handle, "m").render().decode()
    finally:
        handle.shutdown()
    assert 'openinfer:kv_offload_tier_disabled{model_name="m",tier="disk"} 1.0' in text
    assert 'openinfer:kv_offload_tier_disabled{model_name="m",tier="host"} 0.0' in text
    assert e.kv.num_used_blocks == 0
    e.close()


@pytest.mark.parametrize("pieces", [offload.PIECES, SMALL_PIECES])
@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing"])
def test_damaged_disk_files_are_recomputed(qwen3_dir: Path, tmp_path: Path, damage: str,
                                           baseline: dict[int, list[list[int]]],
                                           pieces: tuple[int, ...],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload, "PIECES", pieces)
    batch = prompts(4, 150)
    options = fill_disk(qwen3_dir, tmp_path, batch)
    files = sorted(tmp_path.rglob("*.kv"))
    assert len(files) == 36
    for path in files[::2]:
        data = bytearray(path.read_bytes())
        if damage == "corrupt":
            data[-5] ^= 0xFF
            path.write_bytes(bytes(data))
        elif damage == "truncated":
            path.write_bytes(bytes(data[: len(data) // 2]))
        else:
            path.unlink()
    second = engine(qwen3_dir, **options)
    events = run_staggered(second, [GenerateRequest(f"b{i}", tuple(p), GREEDY)
                                    for i, p in enumerate(batch)], lambda i: 40 * i)
    assert [tokens_of(events[f"b{i}"]) for i in range(4)] == expected(qwen3_dir, baseline, 0,
                                                                      batch)
    assert second.kv.num_used_blocks == 0
    second.close()


def test_abort_while_restoring_frees_everything(qwen3_dir: Path) -> None:
    pm = PluginManager(autoload=True, plugins=[sample_plugin])
    e = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=SMALL_KV,
                            kv_offload=("host", "memory"),
                            kv_offload_host_gib=gib(10, qwen3_dir)), pm)
    batch = prompts(3, 150, seed=3)
    run_staggered(e, [GenerateRequest(f"a{i}", tuple(p), GREEDY)
                      for i, p in enumerate(batch)], lambda i: 40 * i)
    store = sample_plugin.MemoryStore.instances[-1]
    first = hash_blocks(batch[0], 16)[:9]
    tier = e.offload.tier  # type: ignore[union-attr]
    assert isinstance(tier, HostTier)
    assert all(store.contains(k) and tier.slots.find(k) is None for k in first[3:])
    sample_plugin.MemoryStore.gate.clear()  # reads from the store now wait
    try:
        e.add_request(GenerateRequest("slow", tuple(batch[0]), GREEDY))
        e.add_request(GenerateRequest("other", tuple(prompts(1, 30, seed=9)[0]), GREEDY))
        events: list[TokenEvent] = []
        for _ in range(40):  # the other request runs to the end while "slow" waits
            events += e.step()
        other = [ev for ev in events if ev.request_id == "other"]
        assert isinstance(other[-1], Finished) and len(tokens_of(other)) == 6
        assert not [ev for ev in events if ev.request_id == "slow"]
        assert e.snapshot().waiting == 1 and e.kv.num_used_blocks > 0  # blocks being loaded
        e.abort("slow")
        events = e.step()
        assert [type(ev) for ev in events] == [Finished]
        assert events[0].reason is FinishReason.ABORT  # type: ignore[attr-defined]
        assert e.kv.num_used_blocks > 0  # the copy into them has not landed yet
    finally:
        sample_plugin.MemoryStore.gate.set()
    while e.has_work():
        assert not e.step()  # nothing more for the aborted request
    assert e.kv.num_used_blocks == 0
    assert tier.slots.num_referenced() == 0
    e.close()


def reference_blocks(e: Engine, tokens: list[int]) -> dict[int, torch.Tensor]:
    """Hash -> the KV bytes of each full block of `tokens`, from one fresh prefill."""
    seq = RequestState.from_request(GenerateRequest("ref", tuple(tokens)))
    assert e.kv.allocate(seq.request_id, len(tokens))
    try:
        rows = [ScheduledRow(seq, len(tokens), True)]
        batch = plan_batch(rows, e.kv).to_device(torch.device("cpu"))
        e.model.forward(batch)
        full = len(tokens) // 16
        ids = torch.tensor(list(e.kv.block_ids("ref"))[:full])
        tensors = e.model.kv_block_tensors()  # type: ignore[attr-defined]
        rows = torch.empty((full, sum(t[0].nbytes for t in tensors)), dtype=torch.uint8)
        gather_blocks_ref(tensors, ids, rows)
    finally:
        e.kv.free("ref")
    return dict(zip(hash_blocks(tokens, 16)[:full], rows, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("pieces", [offload.PIECES, SMALL_PIECES])
def test_stress_with_aborts_leaves_nothing_behind(qwen3_dir: Path, tmp_path: Path,
                                                  pieces: tuple[int, ...],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """500 requests over 12 shared prefixes, a quarter aborted at random moments, host memory
    and disk both small. Device -> host copies land only at their fourth poll, steps later,
    as on a GPU: a block let go before its copy landed would be saved with another prefix's
    KV under its old hash, and the byte check at the end would see it (it does, with the
    engine's hold on saved blocks taken out)."""
    monkeypatch.setattr(offload, "PIECES", pieces)
    real = DeviceCopier.to_host

    class Later:
        def __init__(self, copy: object) -> None:
            self.copy = copy
            self.polls = 0

        def query(self) -> bool:
            self.polls += 1
            if self.polls < 4:
                return False
            if self.copy is not None:
                self.copy()  # type: ignore[operator]
                self.copy = None
            return True

    monkeypatch.setattr(DeviceCopier, "to_host", lambda self, ids, slots: Later(
        lambda: real(self, ids, slots)))
    rng = random.Random(5)
    stems = prompts(12, 64, seed=11)
    e = engine(qwen3_dir, num_kv_blocks=24, max_num_seqs=8, kv_offload=("host", "disk"),
               kv_offload_host_gib=gib(24, qwen3_dir), kv_offload_disk_dir=str(tmp_path),
               kv_offload_disk_gib=gib(60, qwen3_dir))
    requests = []
    for i in range(500):
        tail = [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 40))]
        params = SamplingParams(max_tokens=rng.randrange(1, 6), temperature=0.0)
        requests.append(GenerateRequest(f"s{i}", tuple(rng.choice(stems) + tail), params))
    aborts = {f"s{i}": rng.randrange(0, 6) for i in rng.sample(range(500), 125)}
    events: dict[str, list[TokenEvent]] = {}
    pending = list(requests)
    step = 0
    while pending or e.has_work():
        for _ in range(rng.randrange(0, 3)):
            if pending:
                req = pending.pop(0)
                e.add_request(req)
                events[req.request_id] = []
        for rid, delay in list(aborts.items()):
            if rid in events and delay == 0:
                e.abort(rid)
                del aborts[rid]
            elif rid in events:
                aborts[rid] = delay - 1
        for ev in e.step():
            events[ev.request_id].append(ev)
        step += 1
        assert step < 20_000
    assert all(isinstance(evs[-1], Finished) for evs in events.values())
    assert sum(evs[-1].reason is FinishReason.ABORT for evs in events.values()) > 50  # type: ignore[attr-defined]
    stats = e.offload.stats()  # type: ignore[union-attr]
    assert stats.restores > 50
    assert e.kv.num_used_blocks == 0
    tier = e.offload.tier  # type: ignore[union-attr]
    assert isinstance(tier, HostTier)
    e.close()  # writes to disk still in flight land
    assert tier.slots.num_referenced() == 0  # every lease released, every copy landed
    # Every block in host memory and on disk holds the KV its hash names.
    ref = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=64))
    truth: dict[int, torch.Tensor] = {}
    for req in requests:
        tokens = list(req.prompt_token_ids) + tokens_of(events[req.request_id])
        keys = hash_blocks(tokens, 16)
        if keys and keys[-1] not in truth:
            truth.update(reference_blocks(ref, tokens))
    checked = 0
    for key, slot in tier.slots._slot_of.items():
        want = truth[key].view(torch.float32)
        assert torch.allclose(tier.pool[slot].view(torch.float32), want, atol=1e-4), key
        checked += 1
    assert checked > 12
    disk = tier.stores[0]
    out = torch.empty(tier.block_bytes, dtype=torch.uint8)
    for key in list(disk._lru):
        if disk.get(key, memoryview(out.numpy())):
            assert torch.allclose(out.view(torch.float32), truth[key].view(torch.float32),
                                  atol=1e-4), key
            checked += 1
    assert checked > 24


def test_metrics_count_restores_per_tier(qwen3_dir: Path, tmp_path: Path) -> None:
    from openinfer_core.engine.async_engine import AsyncEngine
    from openinfer_server.metrics import ServerMetrics

    e = engine(qwen3_dir, kv_offload=("host", "disk"), kv_offload_host_gib=gib(200, qwen3_dir),
               kv_offload_disk_dir=str(tmp_path))
    run_twice(e, prompts(2, 150))
    stats = e.offload.stats()  # type: ignore[union-attr]
    host = stats.tiers[0]
    assert host.hits == stats.restored_blocks > 0  # the rest of each prompt was still in HBM
    handle = AsyncEngine(e)
    try:
        text = ServerMetrics(handle, "m").render().decode()
    finally:
        handle.shutdown()
    assert f'openinfer:kv_offload_hits_total{{model_name="m",tier="host"}} {host.hits}.0' in text
    assert 'openinfer:kv_offload_hits_total{model_name="m",tier="disk"} 0.0' in text
    assert 'openinfer:kv_offload_saved_total{model_name="m",tier="host"} 18.0' in text
    assert 'openinfer:kv_offload_saved_total{model_name="m",tier="disk"} 18.0' in text
    restored = stats.restored_blocks * 16
    assert f'openinfer:kv_offload_restored_tokens_total{{model_name="m"}} {restored}.0' in text
    assert 'openinfer:kv_offload_restore_seconds_count{model_name="m"} 2.0' in text
