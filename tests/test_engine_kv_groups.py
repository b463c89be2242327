"""KV groups through the engine, with a test model that reads its last `horizon + 1` tokens
through a window group's table (window_model.py): the tokens equal the one-group model's and
the exact prediction under chunked prefill, prefix-cache hits (cut short where the window's
tail was evicted), preemption and two tensor-parallel ranks; no group leaks a block; the
memory budget sets the window pool aside. `--kv-offload` with groups:
test_engine_window_offload.py."""

from __future__ import annotations

from pathlib import Path

import engine_helpers
import pytest
from engine_helpers import greedy, run_staggered, tokens_of
from window_model import (
    TOKEN_BYTES,
    WindowedHistoryModel,
    WindowPlugin,
    expected_tokens,
    write_checkpoint,
)

from openinfer_core import Engine, EngineConfig, GenerateRequest, Scheduled
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.kv import GroupedKV
from openinfer_core.plugins import PluginManager
from openinfer_kvcache import window_pool_blocks

HORIZON = 5
BLOCK = 4
VOCAB = 997


def make_engine(tmp_path: Path, groups: bool, ranks: int = 1, **kw: object) -> Engine:
    model = write_checkpoint(tmp_path / f"groups-{groups}", horizon=HORIZON, groups=groups,
                             vocab_size=VOCAB)
    plugins = PluginManager(autoload=True, allowlist={"core", "kernels", "offload"},
                            plugins=[WindowPlugin(ranks)])
    config = EngineConfig(model=str(model), device="cpu", block_size=BLOCK,
                          **kw)  # type: ignore[arg-type]
    return Engine(config, plugins)


def assert_nothing_held(engine: Engine) -> None:
    assert isinstance(engine.kv, GroupedKV)
    assert [(u.name, u.used) for u in engine.kv.group_usage()] == [("window", 0), ("full", 0)]


def random_requests(n: int, seed: int, lengths: tuple[int, int],
                    max_tokens: int) -> list[GenerateRequest]:
    return engine_helpers.random_requests(n, seed, lengths, max_tokens, VOCAB)


def check_tokens(events: dict[str, list], requests: list[GenerateRequest]) -> None:
    for r in requests:
        want = expected_tokens(r.prompt_token_ids, r.params.max_tokens or 0, HORIZON, VOCAB)
        assert tokens_of(events[r.request_id]) == want, r.request_id


@pytest.mark.parametrize("budget", [6, 64])
def test_a_window_group_gives_the_one_group_tokens(tmp_path: Path, budget: int) -> None:
    """Staggered requests, prompts up to 40 tokens, chunked at 6 tokens or whole: the window
    pool (a few blocks a row) is reused many times over, and every token is still right."""
    requests = random_requests(10, seed=budget, lengths=(1, 40), max_tokens=12)
    outputs = []
    for groups in (False, True):
        engine = make_engine(tmp_path, groups, max_num_seqs=4, max_num_batched_tokens=budget)
        outputs.append(run_staggered(engine, requests, lambda i: 2 * i))
        check_tokens(outputs[-1], requests)
        assert engine.kv.num_used_blocks == 0
    assert_nothing_held(engine)
    model = engine.model
    assert isinstance(model, WindowedHistoryModel)
    assert model.pool_blocks[0] == window_pool_blocks(HORIZON, BLOCK, 4, budget)
    assert model.pool_blocks[0] < model.pool_blocks[1]


def test_prefix_hits_keep_the_window_and_are_cut_where_its_tail_is_gone(
        tmp_path: Path) -> None:
    engine = make_engine(tmp_path, True, max_num_seqs=2, max_num_batched_tokens=8)
    prompt = tuple(range(100, 130))  # 30 tokens: 7 full blocks

    def run(rid: str, prompt: tuple[int, ...]) -> list:
        req = GenerateRequest(rid, prompt, greedy(4))
        events = run_staggered(engine, [req], lambda _: 0)[rid]
        check_tokens({rid: events}, [req])
        return events

    run("a", prompt)
    # Every full block of the prompt and its window tail are still cached: 28 tokens hit.
    assert run("b", (*prompt, 7))[0] == Scheduled("b", 31, cached_tokens=28)
    # A long unrelated request cycles the small window pool (its full pool is large): the
    # prompt's full blocks are still cached, its window blocks are not, so nothing is hit.
    run("c", tuple(range(500, 560)))
    assert engine.kv.group_usage()[1].cached >= 7
    assert run("d", (*prompt, 8))[0] == Scheduled("d", 31, cached_tokens=0)
    assert_nothing_held(engine)


def test_preemption_recomputes_with_the_window_group(tmp_path: Path) -> None:
    """A full pool of 12 blocks (44 tokens) for 6 requests of up to 36 tokens each."""
    requests = random_requests(6, seed=5, lengths=(8, 16), max_tokens=20)
    engine = make_engine(tmp_path, True, max_num_seqs=4, max_num_batched_tokens=16,
                         num_kv_blocks=12)
    check_tokens(run_staggered(engine, requests, lambda i: i), requests)
    assert engine.scheduler.num_preemptions > 0  # type: ignore[attr-defined]
    assert_nothing_held(engine)


def test_the_budget_sets_the_window_pool_aside(tmp_path: Path) -> None:
    window = window_pool_blocks(HORIZON, BLOCK, 4, 16)
    window_bytes = TOKEN_BYTES * BLOCK * window
    gib = (100 * TOKEN_BYTES * BLOCK + window_bytes) / 2**30
    engine = make_engine(tmp_path, True, max_num_seqs=4, max_num_batched_tokens=16,
                         cpu_kv_cache_gib=gib)
    assert isinstance(engine.kv, GroupedKV)
    assert [u.total for u in engine.kv.group_usage()] == [window - 1, 99]  # padding excluded
    with pytest.raises(ModelConfigError, match="window and state KV groups' pools"):
        make_engine(tmp_path, True, max_num_seqs=4, max_num_batched_tokens=16,
                    cpu_kv_cache_gib=window_bytes / 2**30)


def test_two_ranks_get_every_groups_tables(tmp_path: Path) -> None:
    """Each rank checks its batch's group tables and window reads (window_model.py): a rank
    without them fails the step."""
    requests = random_requests(4, seed=9, lengths=(1, 20), max_tokens=8)
    engine = make_engine(tmp_path, True, ranks=2, max_num_seqs=4, max_num_batched_tokens=8)
    try:
        check_tokens(run_staggered(engine, requests, lambda i: i), requests)
        assert_nothing_held(engine)
    finally:
        engine.model.close()  # type: ignore[attr-defined]
