"""A recurrent-state KV group through the engine, with a test model that keeps a running hash of
every token in its request's slot beside a full group (state_model.py): the tokens equal the
recompute reference for one request, staggered requests, chunked prefill (the state carried
across chunks), preemption (recomputed from position 0 in a new slot) and two tensor-parallel
ranks; prefix caching hits nothing; no slot leaks after finish or abort; admission waits for a
free slot; the memory budget sets the state pool aside; `--kv-offload` is refused."""

from __future__ import annotations

from pathlib import Path

import engine_helpers
import pytest
from engine_helpers import greedy, run_staggered, tokens_of
from state_model import (
    STATE_BYTES,
    TOKEN_BYTES,
    StateHistoryModel,
    StatePlugin,
    expected_tokens,
    write_checkpoint,
)

from openinfer_core import Engine, EngineConfig, GenerateRequest, Scheduled
from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.kv import GroupedKV
from openinfer_core.plugins import PluginManager

BLOCK = 4
VOCAB = 997


def make_engine(tmp_path: Path, ranks: int = 1, state_slots: int | None = None,
                **kw: object) -> Engine:
    model = write_checkpoint(tmp_path / f"state-{state_slots}", vocab_size=VOCAB,
                             state_slots=state_slots)
    plugins = PluginManager(autoload=True, allowlist={"core", "kernels", "offload"},
                            plugins=[StatePlugin(ranks)])
    config = EngineConfig(model=str(model), device="cpu", block_size=BLOCK,
                          **kw)  # type: ignore[arg-type]
    return Engine(config, plugins)


def usage(engine: Engine) -> list[tuple[str, int]]:
    assert isinstance(engine.kv, GroupedKV)
    return [(u.name, u.used) for u in engine.kv.group_usage()]


def random_requests(n: int, seed: int, lengths: tuple[int, int],
                    max_tokens: int) -> list[GenerateRequest]:
    return engine_helpers.random_requests(n, seed, lengths, max_tokens, VOCAB)


def check_tokens(events: dict[str, list], requests: list[GenerateRequest]) -> None:
    for r in requests:
        want = expected_tokens(r.prompt_token_ids, r.params.max_tokens or 0, VOCAB)
        assert tokens_of(events[r.request_id]) == want, r.request_id


def model_of(engine: Engine) -> StateHistoryModel:
    assert isinstance(engine.model, StateHistoryModel)
    return engine.model


def test_one_request_matches_the_recompute_reference(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, max_num_seqs=4, max_num_batched_tokens=64)
    request = GenerateRequest("a", tuple(range(300, 317)), greedy(24))
    check_tokens(run_staggered(engine, [request], lambda _: 0), [request])
    assert usage(engine) == [("state", 0), ("full", 0)]
    # The state pool: one slot per running request and the padding slot.
    assert model_of(engine).pool_blocks[0] == 4 + 1


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlapped"])
@pytest.mark.parametrize("budget", [5, 64])
def test_staggered_requests_carry_their_state_across_chunks(tmp_path: Path, budget: int,
                                                            overlap: bool) -> None:
    """Ten requests arriving every other step, prompts up to 30 tokens, chunked at 5 tokens
    (a prompt's state carried over many chunks, beside other requests' decodes) or whole;
    every slot is reused several times. Overlapped: each step is laid out while the one
    before runs, and requests ending hold their slot until it has."""
    requests = random_requests(10, seed=budget, lengths=(1, 30), max_tokens=12)
    engine = make_engine(tmp_path, max_num_seqs=4, max_num_batched_tokens=budget,
                         async_scheduling=overlap)
    assert engine.overlapped is overlap
    check_tokens(run_staggered(engine, requests, lambda i: 2 * i), requests)
    assert usage(engine) == [("state", 0), ("full", 0)]
    assert model_of(engine).max_rows == 4


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlapped"])
def test_preemption_recomputes_the_state(tmp_path: Path, overlap: bool) -> None:
    """A full pool of 12 blocks (44 tokens) for 6 requests of up to 36 tokens each: requests
    are preempted, their slots freed, and recomputed from position 0 in a new slot."""
    requests = random_requests(6, seed=5, lengths=(8, 16), max_tokens=20)
    engine = make_engine(tmp_path, max_num_seqs=4, max_num_batched_tokens=16,
                         num_kv_blocks=12, async_scheduling=overlap)
    check_tokens(run_staggered(engine, requests, lambda i: i), requests)
    assert engine.scheduler.num_preemptions > 0  # type: ignore[attr-defined]
    assert usage(engine) == [("state", 0), ("full", 0)]


def test_prefix_caching_hits_nothing_and_the_output_is_right(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, max_num_seqs=2, max_num_batched_tokens=8,
                         enable_prefix_caching=True)
    assert not engine.kv.enable_prefix_caching
    prompt = tuple(range(100, 130))  # 30 tokens: 7 full blocks
    for rid, tail in (("a", ()), ("b", (7,)), ("c", (7,))):
        req = GenerateRequest(rid, (*prompt, *tail), greedy(4))
        events = run_staggered(engine, [req], lambda _: 0)[rid]
        check_tokens({rid: events}, [req])
        assert events[0] == Scheduled(rid, len(req.prompt_token_ids), cached_tokens=0)
    assert engine.kv.prefix_cache_stats.hits == 0
    assert isinstance(engine.kv, GroupedKV)
    assert all(u.cached == 0 for u in engine.kv.group_usage())


def test_finish_and_abort_free_every_slot(tmp_path: Path) -> None:
    engine = make_engine(tmp_path, max_num_seqs=4, max_num_batched_tokens=16)
    requests = random_requests(4, seed=3, lengths=(6, 12), max_tokens=50)
    for r in requests:
        engine.add_request(r)
    for _ in range(4):
        engine.step()
    assert usage(engine)[0] == ("state", 4)
    engine.abort("r0")
    engine.abort("r2")
    engine.step()
    assert usage(engine)[0] == ("state", 2)
    while engine.has_work():
        engine.step()
    assert usage(engine) == [("state", 0), ("full", 0)]
    # The freed slots serve new requests as well.
    again = random_requests(4, seed=4, lengths=(1, 9), max_tokens=6)
    check_tokens(run_staggered(engine, again, lambda i: i), again)
    assert usage(engine) == [("state", 0), ("full", 0)]


def test_admission_waits_for_a_free_slot(tmp_path: Path) -> None:
    """A state pool of 2 slots (and the padding one) under max_num_seqs 4: never more than two
    requests run, the rest wait for a slot and then run right."""
    requests = random_requests(6, seed=8, lengths=(2, 10), max_tokens=8)
    engine = make_engine(tmp_path, state_slots=3, max_num_seqs=4, max_num_batched_tokens=32)
    check_tokens(run_staggered(engine, requests, lambda _: 0), requests)
    assert model_of(engine).max_rows == 2
    assert usage(engine) == [("state", 0), ("full", 0)]


def test_the_budget_sets_the_state_pool_aside(tmp_path: Path) -> None:
    state_bytes = STATE_BYTES * (4 + 1)
    gib = (100 * TOKEN_BYTES * BLOCK + state_bytes) / 2**30
    engine = make_engine(tmp_path, max_num_seqs=4, max_num_batched_tokens=16,
                         cpu_kv_cache_gib=gib)
    assert isinstance(engine.kv, GroupedKV)
    assert [u.total for u in engine.kv.group_usage()] == [4, 99]  # padding excluded
    with pytest.raises(ModelConfigError, match="window and state KV groups' pools"):
        make_engine(tmp_path, max_num_seqs=4, max_num_batched_tokens=16,
                    cpu_kv_cache_gib=(state_bytes + TOKEN_BYTES * BLOCK) / 2**30)


def test_kv_offload_is_refused_for_state_groups(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"--kv-offload: model .*state-None.* "
                                               r"recurrent-state groups \(state\)"):
        make_engine(tmp_path, kv_offload=("host",))


def test_two_ranks_keep_every_state(tmp_path: Path) -> None:
    """Each rank keeps and checks its own states (state_model.py): a rank whose batch lacks
    the state table, or gets the wrong slots, fails the step."""
    requests = random_requests(4, seed=9, lengths=(1, 20), max_tokens=8)
    engine = make_engine(tmp_path, ranks=2, max_num_seqs=4, max_num_batched_tokens=8)
    try:
        check_tokens(run_staggered(engine, requests, lambda i: i), requests)
        assert usage(engine) == [("state", 0), ("full", 0)]
    finally:
        engine.model.close()  # type: ignore[attr-defined]
