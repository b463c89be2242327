"""DeepSeek-V4 through the engine on CPU in fp32, on the paged cache: greedy tokens equal the
whole-sequence reference's (and transformers'), for prompts that slide the 8-token window and
fill compressed entries of both ratios (4 and 8) and more than the indexer keeps (4); whatever
the block size, batching, chunked prefill, preemption or prefix-cache hits, with the window KV
group keeping only what is read again, and a prefix restored by `--kv-offload`;
chunked-prefill logits equal the reference's; checkpoints in DeepSeek's FP8/FP4 format, in
transformers' module names and `--load-format dummy` load and run."""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from dsv4_checkpoints import random_model, to_deepseek, write_model_folder

from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams
from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.request_state import RequestState
from openinfer_core.events import Scheduled
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.plugins import PluginManager
from openinfer_core.testing import run_staggered
from openinfer_core.testing import tokens_of as tokens
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.deepseek_names import weights_from_deepseek
from openinfer_deepseek_v4.hf_names import weights_from_transformers
from openinfer_deepseek_v4.reference import ModelWeights, forward
from openinfer_kvcache import hash_blocks

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model(config):  # type: ignore[no-untyped-def]
    """Larger weights than conftest's model: its greedy continuations wander over the
    vocabulary instead of settling into a three-token cycle, so they test more."""
    return random_model(config, scale=0.5)


@pytest.fixture(scope="module")
def cfg(config) -> DeepseekV4Config:  # type: ignore[no-untyped-def]
    return DeepseekV4Config.from_dict(json.loads(config.to_json_string()))


@pytest.fixture(scope="module")
def weights(model, cfg: DeepseekV4Config) -> ModelWeights:  # type: ignore[no-untyped-def]
    return weights_from_transformers(model.state_dict(), cfg)


@pytest.fixture(scope="module")
def folder(model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    return write_model_folder(model, tmp_path_factory.mktemp("dsv4") / "tiny")


@pytest.fixture(scope="module")
def tied(config, tmp_path_factory: pytest.TempPathFactory  # type: ignore[no-untyped-def]
         ) -> tuple[Path, ModelWeights, DeepseekV4Config]:
    """A model whose indexer has 2 heads: an entry both heads' ReLU zero scores exactly 0, so
    equal scores at the top-k boundary are common (transformers breaks them its own way; the
    reference and the engine both give them to the earlier entry)."""
    settings = json.loads(config.to_json_string()) | {"index_n_heads": 2}
    model = random_model(type(config)(**settings), scale=0.5)
    cfg = DeepseekV4Config.from_dict(settings)
    return (write_model_folder(model, tmp_path_factory.mktemp("dsv4") / "tied"),
            weights_from_transformers(model.state_dict(), cfg), cfg)


def engine(folder: Path, **kw: object) -> Engine:
    options: dict[str, object] = {"max_model_len": 256, **kw}
    return Engine(EngineConfig(model=str(folder), device="cpu", **options))  # type: ignore[arg-type]


def prompts(n: int, seed: int, lengths: tuple[int, int] = (1, 50)) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(2, 64) for _ in range(rng.randint(*lengths))) for _ in range(n)]


@torch.no_grad()
def reference_greedy(weights: ModelWeights, cfg: DeepseekV4Config, prompt: Sequence[int],
                     n: int = NEW_TOKENS) -> list[int]:
    """n greedy tokens, the whole sequence recomputed for each."""
    ids = torch.tensor(prompt)
    for _ in range(n):
        ids = torch.cat([ids, forward(ids, weights, cfg)[-1].argmax()[None]])
    return ids[len(prompt):].tolist()


def greedy_requests(batch: Sequence[tuple[int, ...]], tag: str,
                    n: int = NEW_TOKENS) -> list[GenerateRequest]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return [GenerateRequest(f"{tag}{i}", p, params) for i, p in enumerate(batch)]


def one_at_a_time(eng: Engine, batch: Sequence[tuple[int, ...]]) -> list[list[int]]:
    out = []
    for request in greedy_requests(batch, "alone"):
        out.append(tokens(run_staggered(eng, [request], lambda _: 0)[request.request_id]))
    return out


def test_the_plugin_registers_the_line(config) -> None:  # type: ignore[no-untyped-def]
    entry = PluginManager(autoload=True).registries.models.match(json.loads(
        config.to_json_string()) | {"architectures": ["DeepseekV4ForCausalLM"]})
    assert (entry.name, entry.plugin) == ("deepseek-v4", "deepseek_v4")


@pytest.mark.parametrize("block_size", [16, 6])
def test_greedy_equals_the_reference_and_transformers(folder: Path, model, weights, cfg,  # type: ignore[no-untyped-def]
                                                      block_size: int) -> None:
    """Block size 6 splits windows of both ratios across blocks (a CSA block holds 2 entry
    slots, an HCA block 1)."""
    eng = engine(folder, block_size=block_size)
    batch = [(7,), *prompts(2, 1, (13, 45))]
    for prompt, got in zip(batch, one_at_a_time(eng, batch), strict=True):
        assert got == reference_greedy(weights, cfg, prompt)
        with torch.no_grad():
            want = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, do_sample=False)
        assert got == want[0, len(prompt):].tolist()
    assert eng.kv.num_used_blocks == 0


def test_side_branches_named_give_the_reference_tokens(folder: Path, weights, cfg,  # type: ignore[no-untyped-def]
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """With every side branch named (side_branches.py) the decode steps run the compressor's
    and indexer's pools before the query path and the shared expert before the router (on
    CPU in place of a side stream): the same greedy tokens as the reference."""
    monkeypatch.setenv("OPENINFER_DSV4_SIDE_STREAM", "1")
    eng = engine(folder)
    assert eng.model._side == {"shared", "pool"}
    batch = [(7,), *prompts(2, 1, (13, 45))]
    for prompt, got in zip(batch, one_at_a_time(eng, batch), strict=True):
        assert got == reference_greedy(weights, cfg, prompt)
    assert eng.kv.num_used_blocks == 0


@pytest.mark.parametrize("variant", ["plain", "tied"])
def test_staggered_chunked_and_preempted_requests_match_one_at_a_time(  # type: ignore[no-untyped-def]
        folder: Path, weights, cfg, tied, variant: str) -> None:
    if variant == "tied":
        folder, weights, cfg = tied
    batch = prompts(6, 2)  # six: enough to overlap chunks, decodes and preemptions
    alone = one_at_a_time(engine(folder), batch)
    assert alone[0] == reference_greedy(weights, cfg, batch[0])
    # chunked prefill: a 7-token budget splits prompts and mixes them with decodes (in steps
    # that do not overlap, the other tests' do)
    chunked = engine(folder, max_num_batched_tokens=7, block_size=8, async_scheduling=False)
    events = run_staggered(chunked, greedy_requests(batch, "c"), lambda i: 2 * i)
    assert [tokens(events[f"c{i}"]) for i in range(len(batch))] == alone
    # preemption: 12 blocks of 8 tokens hold about two requests at full length
    tight = engine(folder, num_kv_blocks=13, block_size=8, max_model_len=96)
    events = run_staggered(tight, greedy_requests(batch, "p"), lambda i: i // 2)
    assert tight.scheduler.num_preemptions > 0  # type: ignore[attr-defined]
    assert [tokens(events[f"p{i}"]) for i in range(len(batch))] == alone
    assert chunked.kv.num_used_blocks == tight.kv.num_used_blocks == 0


def test_prefix_cache_hits_give_the_same_tokens(folder: Path, weights, cfg) -> None:  # type: ignore[no-untyped-def]
    eng = engine(folder)
    first = prompts(1, 3, (45, 45))[0]
    shares = (*first[:40], 9, 9, 9)
    run_staggered(eng, greedy_requests([first], "warm"), lambda _: 0)
    for tag, prompt in (("again", first), ("shared", shares)):
        events = run_staggered(eng, greedy_requests([prompt], tag), lambda _: 0)[f"{tag}0"]
        assert events[0] == Scheduled(f"{tag}0", prompt_tokens=len(prompt), cached_tokens=32)
        assert tokens(events) == reference_greedy(weights, cfg, prompt)


@pytest.mark.parametrize("block_size", [8, 4])
def test_window_groups_keep_only_what_is_read(folder: Path, weights, cfg,  # type: ignore[no-untyped-def]
                                              block_size: int) -> None:
    """The raw entries and compressor projections live in a window KV group (horizon 7 here:
    the 8-token window, CSA's two 4-token windows, HCA's one 8-token window), the CSA entries
    and indexer keys in the full group, the HCA entries in the periodic group `full-8`, which
    at block size 4 holds every other block (those holding a position 8k - 1). Between steps a
    request holds at most the window blocks of its last 7 tokens however long it gets, and no
    step reads a block it gave back or a periodic position it does not hold: those are the
    padding block 0, filled with 100s in every window tensor and the HCA entries here, which
    would change the tokens. (Not NaN: the CPU attention reads slot 0 for its -1s, then
    weighs them 0.)"""
    eng = engine(folder, block_size=block_size, max_num_batched_tokens=16)
    groups = [(g.name, g.horizon, g.period) for g in eng.kv.groups]  # type: ignore[attr-defined]
    assert groups == [("full", None, 1), ("full-8", None, 8), ("window-7", 7, 1)]
    model = eng.model
    for layer in model.layers:  # type: ignore[attr-defined]
        padding = [layer.kv] + [t for p in (layer.compressor, layer.indexer) if p is not None
                                for t in (p.projections, p.entries if p.entry_group else None)
                                if t is not None]
        for t in padding:
            t[0] = 100.0
    prompt = prompts(1, 8, (45, 45))[0]
    eng.add_request(greedy_requests([prompt], "w")[0])
    events, held = [], []
    while eng.has_work():
        events += eng.step()
        full, periodic, window = eng.kv.group_usage()  # type: ignore[attr-defined]
        held.append((full.used, periodic.used, window.used))
    assert tokens(events) == reference_greedy(weights, cfg, prompt)
    assert max(w for *_, w in held) == (7 - 1) // block_size + 2
    blocks = -(-(45 + NEW_TOKENS - 1) // block_size)
    assert max(f for f, *_ in held) == blocks  # every full block kept
    assert max(p for _, p, _ in held) == sum(eng.kv.groups[1].holds_block(i, block_size)  # type: ignore[attr-defined]
                                             for i in range(blocks))


@torch.inference_mode()
def chunked_logits(eng: Engine, batch: Sequence[Sequence[int]], chunks: Sequence[int],
                   scratch: bool = False) -> list[torch.Tensor]:
    """fp32 logits at every position of each prompt, the prompts prefilled side by side, each
    `chunks[i]` tokens a step (the blocks are freed afterwards). `scratch`: as start-up's
    scratch steps run, on a cache made without step limits (every group's pool as large as
    the full one's) and with batches that carry no group tables (every group reads the full
    group's block ids)."""
    kv = (eng.model.create_kv_cache(eng.kv.num_total_blocks, eng.kv.block_size) if scratch
          else eng.kv)
    seqs = [RequestState.from_request(GenerateRequest(f"chunked{i}", tuple(p)))
            for i, p in enumerate(batch)]
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    try:
        for s in seqs:
            assert kv.allocate(s.request_id, s.num_tokens)
        while any(s.num_computed_tokens < s.num_tokens for s in seqs):
            rows = [ScheduledRow(s, min(c, s.num_tokens - s.num_computed_tokens), True)
                    for s, c in zip(seqs, chunks, strict=True)
                    if s.num_computed_tokens < s.num_tokens]
            host = plan_batch(rows, kv)
            assert len(host.group_block_tables) == 3  # full, full-8 and window-7
            if scratch:
                host = dataclasses.replace(host, group_block_tables=())
            step = host.to_device(eng.model.device)
            step.logits_indices = torch.arange(step.num_tokens)
            logits = eng.model.forward(step).split([r.num_new_tokens for r in rows])
            for row, part in zip(rows, logits, strict=True):
                out[seqs.index(row.seq)].append(part)
                row.seq.num_computed_tokens += row.num_new_tokens
    finally:
        for s in seqs:
            kv.free(s.request_id)
    return [torch.cat(parts) for parts in out]


@pytest.mark.parametrize("variant", ["plain", "tied", "scratch"])
def test_chunked_prefill_logits_equal_the_whole_sequence(folder: Path, weights, cfg,  # type: ignore[no-untyped-def]
                                                         tied, variant: str) -> None:
    if variant == "tied":
        folder, weights, cfg = tied
    batch = prompts(3, 4, (40, 50))
    got = chunked_logits(engine(folder, block_size=8), batch, chunks=[5, 11, 50],
                         scratch=variant == "scratch")
    for prompt, ours in zip(batch, got, strict=True):
        with torch.no_grad():
            want = forward(torch.tensor(prompt), weights, cfg)
        torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("layout", ["deepseek-fp8-fp4", "transformers-modules"])
def test_other_checkpoint_layouts_run_as_their_weights(model, cfg, weights, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                       layout: str) -> None:
    """DeepSeek's own FP8/FP4 format (as its dequantized weights), and a state dict saved in
    transformers' module names (`save_pretrained` writes DeepSeek's names, the other tests')."""
    if layout == "deepseek-fp8-fp4":
        tensors, _ = to_deepseek(dict(model.state_dict()), cfg)
        weights = weights_from_deepseek(tensors, cfg, dtype=torch.float32)
    else:
        tensors = dict(model.state_dict())
    folder = write_model_folder(model, tmp_path / layout, tensors=tensors)
    batch = prompts(2, 5, (20, 40))
    for prompt, got in zip(batch, one_at_a_time(engine(folder), batch), strict=True):
        assert got == reference_greedy(weights, cfg, prompt)


def test_dummy_weights_run(folder: Path) -> None:
    eng = engine(folder, load_format="dummy")
    got = one_at_a_time(eng, prompts(2, 6, (10, 30)))
    assert all(len(t) == NEW_TOKENS for t in got)


def test_a_prefix_restored_from_host_memory_gives_the_reference_tokens(  # type: ignore[no-untyped-def]
        folder: Path, weights, cfg) -> None:
    """`--kv-offload host`: the full group's compressed entries and the window group's raw
    entries and projections are saved group by group (the window's while its horizon holds
    them); a prompt evicted from the device comes back with its window tail and gives the
    reference's tokens."""
    eng = engine(folder, block_size=8, num_kv_blocks=9, max_model_len=64,
                 max_num_batched_tokens=16, kv_offload=("host",), kv_offload_host_gib=0.01)
    first = prompts(1, 11, (45, 45))[0]
    other = prompts(1, 12, (50, 50))[0]  # with its output, every device block
    run_staggered(eng, greedy_requests([first], "warm", 8), lambda _: 0)
    run_staggered(eng, greedy_requests([other], "other", 8), lambda _: 0)
    full = eng.kv.pools[0]  # type: ignore[attr-defined]
    assert all(full.lookup(h) is None for h in hash_blocks(first, 8))  # evicted
    events = run_staggered(eng, greedy_requests([first], "again", 8), lambda _: 0)["again0"]
    # Blocks 0..4 come back; a step after 40 tokens reads window block 4, saved as sealed.
    assert events[0] == Scheduled("again0", prompt_tokens=len(first), cached_tokens=40)
    assert tokens(events) == reference_greedy(weights, cfg, first, 8)
    stats = eng.offload.stats()  # type: ignore[attr-defined]
    assert (stats.restores, stats.restored_blocks) == (1, 5)
    assert all(u.used == 0 for u in eng.kv.group_usage())  # type: ignore[attr-defined]


def test_a_restore_fills_a_periodic_group_where_it_holds_blocks(  # type: ignore[no-untyped-def]
        folder: Path, weights, cfg) -> None:
    """Block size 4: the HCA entries' group (`full-8`) holds every other block, padding
    between. A prompt evicted from the device comes back from host memory with those blocks
    alone, and gives the reference's tokens; nothing is left held."""
    eng = engine(folder, block_size=4, num_kv_blocks=16, max_model_len=60,
                 max_num_batched_tokens=16, kv_offload=("host",), kv_offload_host_gib=0.01)
    names = [g.name for g in eng.kv.groups]  # type: ignore[attr-defined]
    assert "full-8" in names
    first = prompts(1, 11, (45, 45))[0]
    other = prompts(1, 12, (50, 50))[0]
    run_staggered(eng, greedy_requests([first], "warm", 8), lambda _: 0)
    run_staggered(eng, greedy_requests([other], "other", 8), lambda _: 0)
    full = eng.kv.pools[0]  # type: ignore[attr-defined]
    assert all(full.lookup(h) is None for h in hash_blocks(first, 4))  # evicted
    events = run_staggered(eng, greedy_requests([first], "again", 8), lambda _: 0)["again0"]
    scheduled = events[0]
    assert isinstance(scheduled, Scheduled) and scheduled.cached_tokens >= 32
    assert tokens(events) == reference_greedy(weights, cfg, first, 8)
    assert eng.offload.stats().restores == 1  # type: ignore[attr-defined]
    assert all(u.used == 0 for u in eng.kv.group_usage())  # type: ignore[attr-defined]


def test_a_restore_is_cut_where_the_periodic_group_lacks_a_block(  # type: ignore[no-untyped-def]
        folder: Path, weights, cfg) -> None:
    """The HCA group's host tier forgets everything: its first block (position 1 at block
    size 4: tokens 4..7 close the first 8-token window) is missing, so the restore is cut
    before it, to block 0 alone, and the rest is recomputed to the reference's tokens."""
    eng = engine(folder, block_size=4, num_kv_blocks=16, max_model_len=60,
                 max_num_batched_tokens=16, kv_offload=("host",), kv_offload_host_gib=0.01)
    first = prompts(1, 11, (45, 45))[0]
    other = prompts(1, 12, (50, 50))[0]
    run_staggered(eng, greedy_requests([first], "warm", 8), lambda _: 0)
    run_staggered(eng, greedy_requests([other], "other", 8), lambda _: 0)
    names = [g.name for g in eng.kv.groups]  # type: ignore[attr-defined]
    hca = eng.offload.tiers[names.index("full-8")]  # type: ignore[attr-defined]
    hca.flush()
    hca.evict_all()
    events = run_staggered(eng, greedy_requests([first], "again", 8), lambda _: 0)["again0"]
    scheduled = events[0]
    assert isinstance(scheduled, Scheduled) and scheduled.cached_tokens <= 4
    assert tokens(events) == reference_greedy(weights, cfg, first, 8)
    assert all(u.used == 0 for u in eng.kv.group_usage())  # type: ignore[attr-defined]
