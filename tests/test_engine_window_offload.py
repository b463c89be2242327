"""`--kv-offload` for a model with a window KV group (window_model.py, horizon 5, 4-token
blocks), end to end on CPU: each group's sealed blocks go to its own host (and disk) chain, the
window group's only while its horizon still held them; a prefix evicted from the device comes
back from host memory or disk and gives the predicted tokens; a restore whose window tail was
not saved is cut to the last block whose tail was; byte counts are exact per group and nothing
is left held."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import greedy, run_staggered, tokens_of
from test_engine_kv_groups import HORIZON, VOCAB, assert_nothing_held, make_engine
from window_model import TOKEN_BYTES, expected_tokens

from openinfer_core import Engine, GenerateRequest, Scheduled
from openinfer_core.engine.offload import KVOffload
from openinfer_kvcache import hash_blocks
from openinfer_offload.host import HostTier

BLOCK = 4
BLOCK_BYTES = TOKEN_BYTES * BLOCK  # one block of either group
PROMPT = tuple(range(100, 140))  # 40 tokens: 10 full blocks
OTHER = tuple(range(600, 648))  # 48 tokens: with its output, every device block


def offload_engine(tmp_path: Path, tiers: tuple[str, ...] = ("host",)) -> Engine:
    # 13 usable full blocks: OTHER evicts every block of PROMPT from the device. Prefill
    # chunks of 16 tokens (4 blocks): of each chunk's blocks the window group still holds
    # the last two when they are sealed (positions >= chunk end - 5).
    return make_engine(tmp_path, True, max_num_seqs=2, max_num_batched_tokens=16,
                       num_kv_blocks=14, kv_offload=tiers, kv_offload_host_gib=1e-4,
                       kv_offload_disk_dir=str(tmp_path / "kv"), kv_offload_disk_gib=1e-3)


def run(engine: Engine, rid: str, prompt: tuple[int, ...], n: int = 4) -> tuple[list[int], int]:
    """Runs one request alone: its tokens (checked against the model's prediction) and its
    cached_tokens."""
    events = run_staggered(engine, [GenerateRequest(rid, prompt, greedy(n))], lambda _: 0)[rid]
    tokens = tokens_of(events)
    assert tokens == expected_tokens(prompt, n, HORIZON, VOCAB), rid
    return tokens, next(ev.cached_tokens for ev in events if isinstance(ev, Scheduled))


def hosts(engine: Engine) -> dict[str, HostTier]:
    """Each group's host tier, by group name."""
    offload = engine.offload  # type: ignore[attr-defined]
    assert isinstance(offload, KVOffload)
    names = [g.name for g in engine.kv.groups]  # type: ignore[attr-defined]
    tiers = {names[g]: t for g, t in offload.tiers.items()}
    assert all(isinstance(t, HostTier) for t in tiers.values())
    return tiers  # type: ignore[return-value]


def assert_evicted(engine: Engine, prompt: tuple[int, ...]) -> None:
    """No block of `prompt` is left in the device's full group."""
    pool = engine.kv.pools[1]  # type: ignore[attr-defined]
    assert all(pool.lookup(h) is None for h in hash_blocks(prompt, BLOCK))


def assert_clean(engine: Engine) -> None:
    assert_nothing_held(engine)
    offload = engine.offload  # type: ignore[attr-defined]
    assert not offload.busy() and not offload.waiting()
    for tier in hosts(engine).values():
        tier.flush()  # writes to disk hold their slots until they land
        assert tier.slots.num_referenced() == 0


def test_each_group_saves_its_blocks_with_exact_bytes(tmp_path: Path) -> None:
    engine = offload_engine(tmp_path)
    run(engine, "a", PROMPT)
    stats = {name: t.stats()[0] for name, t in hosts(engine).items()}
    # Full group: blocks 0..9. Window: per 16-token chunk the blocks its horizon still
    # held (2, 3; 6, 7; 8, 9); the decode seals no block (43 tokens have KV).
    assert (stats["full"].saved, stats["window"].saved) == (10, 6)
    assert stats["full"].bytes_in == 10 * BLOCK_BYTES
    assert stats["window"].bytes_in == 6 * BLOCK_BYTES
    merged = engine.offload.stats().tiers  # type: ignore[attr-defined]
    assert [(s.name, s.saved, s.bytes_in) for s in merged] == [("host", 16, 16 * BLOCK_BYTES)]
    assert_clean(engine)


@pytest.mark.parametrize("tiers", [("host",), ("host", "disk")])
def test_an_evicted_prefix_comes_back_with_its_window_tail(tmp_path: Path,
                                                           tiers: tuple[str, ...]) -> None:
    engine = offload_engine(tmp_path, tiers)
    tokens, _ = run(engine, "a", PROMPT)
    run(engine, "other", OTHER)
    assert_evicted(engine, PROMPT)
    if len(tiers) > 1:  # host memory forgets: the blocks come back from disk
        for tier in hosts(engine).values():
            tier.flush()
            tier.evict_all()
    # The conversation goes on: 40 tokens (10 blocks, window tail 8, 9) come back.
    _, cached = run(engine, "b", (*PROMPT, *tokens, 7))
    assert cached == 40
    offload = engine.offload.stats()  # type: ignore[attr-defined]
    assert (offload.restores, offload.restored_blocks) == (1, 10)
    if len(tiers) > 1:
        disk = offload.tiers[1]
        assert disk.name == "disk" and disk.hits == 10 + 2  # full blocks and window tail
    assert_clean(engine)


def test_a_restore_is_cut_where_the_window_tail_was_not_saved(tmp_path: Path) -> None:
    engine = offload_engine(tmp_path)
    run(engine, "a", PROMPT)
    run(engine, "other", OTHER)
    assert_evicted(engine, PROMPT)
    # Shares blocks 0..4 with PROMPT: a hit of 5 blocks needs window blocks 3, 4, and block
    # 4 was given back unsaved; one of 4 blocks needs 2, 3, which were saved.
    _, cached = run(engine, "b", (*PROMPT[:22], *range(900, 908)))
    assert cached == 16
    assert engine.offload.stats().restored_blocks == 4  # type: ignore[attr-defined]
    assert_clean(engine)


def test_a_window_tail_missing_everywhere_restores_nothing(tmp_path: Path) -> None:
    """A whole-prompt prefill saves only the window group's last blocks: a prefix that ends
    earlier has no tail anywhere, and is recomputed."""
    engine = make_engine(tmp_path, True, max_num_seqs=2, max_num_batched_tokens=64,
                         num_kv_blocks=14, kv_offload=("host",), kv_offload_host_gib=1e-4)
    run(engine, "a", PROMPT)
    assert hosts(engine)["window"].stats()[0].saved == 2  # blocks 8, 9: positions >= 35
    run(engine, "other", OTHER)
    _, cached = run(engine, "b", (*PROMPT[:30], 5, 6))
    assert cached == 0
    assert engine.offload.stats().restored_blocks == 0  # type: ignore[attr-defined]
    assert_clean(engine)
