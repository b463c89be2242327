"""The host layout of a step (`plan_batch`), the CUDA-graph buckets, and dummy weights."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from openinfer_core.engine.batch import plan_batch, scratch_group_tables, several_groups
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.cuda_graphs import (
    graph_buckets,
    group_table_buffers,
    mixed_buckets,
    padded_slots,
)
from openinfer_core.engine.graph_inputs import GraphInputs, InputLayout, stage_decode, stage_mixed
from openinfer_core.engine.request_state import RequestState
from openinfer_core.interfaces.kv import SCRATCH_STATE_SLOTS, KVGroupSpec
from openinfer_core.interfaces.model import HostBatch
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.request import GenerateRequest
from openinfer_core.startup.eager_warmup import warm_up_batches
from openinfer_core.startup.memory_budget import profile_batch
from openinfer_kvcache import GroupedKVManager, PagedKVManager, group_pool_blocks


def _seq(rid: str, tokens: list[int], computed: int) -> RequestState:
    seq = RequestState.from_request(GenerateRequest(rid, tuple(tokens)))
    seq.num_computed_tokens = computed
    return seq


def test_plan_batch_lays_out_a_mixed_step_exactly() -> None:
    kv = PagedKVManager(num_blocks=16, block_size=4)
    a = _seq("a", list(range(100, 106)), computed=5)  # decode: token 5 of 6
    b = _seq("b", list(range(200, 210)), computed=4)  # chunk: tokens 4..8 of 10
    c = _seq("c", [7, 8, 9], computed=0)  # a whole 3-token prompt
    assert kv.allocate("a", 6) and kv.allocate("b", 9) and kv.allocate("c", 3)
    assert list(kv.block_ids("a")) == [1, 2]
    assert list(kv.block_ids("b")) == [3, 4, 5]
    assert list(kv.block_ids("c")) == [6]
    host = plan_batch([ScheduledRow(a, 1, True), ScheduledRow(b, 5, False),
                       ScheduledRow(c, 3, True)], kv)
    assert host.input_ids.tolist() == [105, 204, 205, 206, 207, 208, 7, 8, 9]
    assert host.positions.tolist() == [5, 4, 5, 6, 7, 8, 0, 1, 2]
    # slot = block * 4 + offset: a's position 5 is block 2 offset 1; b's 4..8 run over blocks
    # 4 and 5; c sits at the start of block 6.
    assert host.slot_mapping.tolist() == [9, 16, 17, 18, 19, 20, 24, 25, 26]
    assert host.query_start_loc.tolist() == [0, 1, 6, 9]
    assert host.seq_lens.tolist() == [6, 9, 3]
    assert host.block_tables.tolist() == [[1, 2, 0], [3, 4, 5], [6, 0, 0]]
    assert host.logits_indices.tolist() == [0, 8]  # b's chunk does not sample
    assert (host.max_query_len, host.max_seq_len) == (5, 9)
    assert not host.is_decode
    assert host.input_ids.dtype == np.int64 and host.block_tables.dtype == np.int32


def test_a_decode_step_is_what_graphs_replay() -> None:
    kv = PagedKVManager(num_blocks=8, block_size=4)
    seqs = [_seq(f"r{i}", [1, 2, 3, 4, 5], computed=4) for i in range(3)]
    for s in seqs:
        assert kv.allocate(s.request_id, 5)
    host = plan_batch([ScheduledRow(s, 1, True) for s in seqs], kv)
    assert host.is_decode and host.num_seqs == 3
    assert host.slot_mapping.tolist() == [2 * 4 + 0, 4 * 4 + 0, 6 * 4 + 0]


def test_plan_batch_lays_out_every_kv_groups_table() -> None:
    """A window group first, then the full group: `block_tables` and the slots stay the full
    group's; the window's table keeps only the blocks its horizon still reads."""
    kv = GroupedKVManager((KVGroupSpec("window", horizon=3), KVGroupSpec("full")), (16, 16),
                          block_size=4)
    a = _seq("a", list(range(100, 110)), computed=9)  # decode at position 9
    b = _seq("b", [7, 8, 9], computed=0)
    assert kv.allocate("a", 9)
    kv.cache_blocks("a", a.token_ids, 9)  # a token at 9 reads 6..9: block 0 is given back
    assert kv.allocate("a", 10) and kv.allocate("b", 3)
    assert [list(t) for t in kv.group_block_ids("a")] == [[0, 2, 3], [1, 2, 3]]
    assert [list(t) for t in kv.group_block_ids("b")] == [[4], [4]]
    groups = several_groups(kv)
    assert groups is kv
    host = plan_batch([ScheduledRow(a, 1, True), ScheduledRow(b, 3, True)], kv)
    window, full = host.group_block_tables
    assert full is host.block_tables
    assert full.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert window.tolist() == [[0, 2, 3], [4, 0, 0]] and window.dtype == np.int32
    assert host.slot_mapping.tolist() == [3 * 4 + 1, 16, 17, 18]
    # On the device the full group's table is moved once; the host image comes back whole
    # (the tensor-parallel ranks get it pickled, identity included).
    batch = host.to_device(torch.device("cpu"))
    assert batch.group_table(1) is batch.block_tables
    assert batch.group_table(0).tolist() == window.tolist()
    batch.host = None
    back = HostBatch.of(batch)
    assert [t.tolist() for t in back.group_block_tables] == [window.tolist(), full.tolist()]
    sent = pickle.loads(pickle.dumps(host))
    assert sent.group_block_tables[1] is sent.block_tables
    assert sent.group_block_tables[0].tolist() == window.tolist()


def test_a_state_groups_table_is_one_slot_per_row() -> None:
    """A state group first, then the full group: the state's table is [rows, 1], each row's
    slot, whatever its length."""
    kv = GroupedKVManager((KVGroupSpec("state", state=True), KVGroupSpec("full")), (4, 16),
                          block_size=4)
    a = _seq("a", list(range(100, 110)), computed=9)
    b = _seq("b", [7, 8, 9], computed=0)
    assert kv.allocate("a", 10) and kv.allocate("b", 3)
    host = plan_batch([ScheduledRow(a, 1, True), ScheduledRow(b, 3, True)], kv)
    state, full = host.group_block_tables
    assert full is host.block_tables and full.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert state.tolist() == [[1], [2]] and state.dtype == np.int32
    batch = host.to_device(torch.device("cpu"))
    assert batch.group_table(0).tolist() == [[1], [2]]
    sent = pickle.loads(pickle.dumps(host))
    assert sent.group_block_tables[0].tolist() == [[1], [2]]


def test_scratch_batches_get_state_slots_inside_the_scratch_pool() -> None:
    groups = (KVGroupSpec("state", state=True), KVGroupSpec("full"), KVGroupSpec("w", 3))
    tables = np.array([[1, 2], [3, 4], [12, 13], [0, 0]], dtype=np.int32)
    state, full, window = scratch_group_tables(groups, tables)
    assert full is tables and window is tables
    assert state.tolist() == [[1], [3], [SCRATCH_STATE_SLOTS - 1], [0]]
    # The scratch pool has min(num_blocks, SCRATCH_STATE_SLOTS) slots: each row's is in it.
    pool = group_pool_blocks(groups, int(tables.max()) + 1, 4, None)[0]
    assert int(state.max()) < pool
    # Without a state group a scratch batch has no tables per group.
    assert scratch_group_tables(groups[1:], tables) == ()
    # The profile step and the eager warm-up steps of a model with a state group carry them.
    model = SimpleNamespace(kv_groups=groups[:2], kv_window_bytes=lambda *a: 0,
                            create_kv_cache=lambda *a: None, max_model_len=64,
                            device=torch.device("cpu"))
    config = EngineConfig(model="m", device="cpu", block_size=4, max_num_seqs=16,
                          max_num_batched_tokens=40)
    profile = profile_batch(config, model)  # type: ignore[arg-type]
    slots = profile.group_block_tables[0]
    assert slots.shape == (profile.num_seqs, 1) and int(slots.min()) > 0
    assert int(slots.max()) < group_pool_blocks(groups, int(profile.block_tables.max()) + 1,
                                                4, None)[0]
    assert profile.group_block_tables[1] is profile.block_tables
    warm = warm_up_batches(config, model, 0)  # type: ignore[arg-type]
    assert warm and all(b.group_table(0).shape == (b.num_seqs, 1) for b in warm)


def test_graph_buffers_give_a_state_group_one_slot_per_row() -> None:
    groups = (KVGroupSpec("state", state=True), KVGroupSpec("full"), KVGroupSpec("w", 3))
    tables = torch.zeros(8, 5, dtype=torch.int32)
    state, full, window = group_table_buffers(groups, tables)
    assert full is tables and window.shape == (8, 5) and window is not tables
    assert state.shape == (8, 1) and state.dtype == torch.int32
    assert group_table_buffers(groups[1:2], tables) == ()
    # A step's slots fill the whole buffer: the padding rows past it on slot 0, not on the
    # slots an earlier, larger step left there.
    assert padded_slots(np.array([[3], [1]], dtype=np.int32), 4).tolist() == [[3], [1], [0],
                                                                              [0]]


def test_one_group_adds_no_tables() -> None:
    kv = PagedKVManager(num_blocks=8, block_size=4)
    a = _seq("a", [1, 2, 3], computed=0)
    assert kv.allocate("a", 3) and several_groups(kv) is None
    host = plan_batch([ScheduledRow(a, 3, True)], kv)
    assert host.group_block_tables == ()
    batch = host.to_device(torch.device("cpu"))
    assert batch.group_block_tables == () and batch.group_table(0) is batch.block_tables


@pytest.mark.parametrize(("max_batch", "expected"), [
    (1, [1]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (16, [1, 2, 4, 8, 16]),
    (40, [1, 2, 4, 8, 16, 32, 40]),
    (256, [1, 2, 4, 8, *range(16, 257, 16)]),
])
def test_graph_buckets(max_batch: int, expected: list[int]) -> None:
    assert graph_buckets(max_batch) == expected


@pytest.mark.parametrize(("max_tokens", "expected"), [
    (0, []), (8, []), (16, [16]), (40, [16, 32, 40]), (64, [16, 32, 64]),
    (512, [16, 32, 64, 128, 192, 256, 320, 384, 448, 512]), (100, [16, 32, 64, 100]),
    (2048, [16, 32, *range(64, 513, 64), 768, 1024, 1280, 1536, 1792, 2048]),
    (1000, [16, 32, *range(64, 513, 64), 768, 1000]),
])
def test_mixed_buckets(max_tokens: int, expected: list[int]) -> None:
    assert mixed_buckets(max_tokens) == expected


def test_a_mixed_step_is_staged_with_padding_tokens_and_requests() -> None:
    kv = PagedKVManager(num_blocks=8, block_size=4)
    a = _seq("a", [1, 2, 3, 4, 5], computed=4)  # decode
    b = _seq("b", [6, 7, 8, 9, 10, 11], computed=0)  # a chunk of 5 that does not sample
    for s, n in ((a, 5), (b, 6)):
        assert kv.allocate(s.request_id, n)
    host = plan_batch([ScheduledRow(a, 1, True), ScheduledRow(b, 5, False)], kv)
    layout = InputLayout(tokens=16, slots=4, decode=False)
    staging = np.full(layout.words + 3, -7, dtype=np.int64)
    stage_mixed(layout.views(staging), host)
    # One copy moves the whole step: the graph's buffer reads what the host laid out.
    inputs = GraphInputs(layout, torch.device("cpu"))
    inputs.copy_from(torch.from_numpy(staging))
    got = {k: v.tolist() for k, v in inputs.views.items()}
    assert got["input_ids"] == [5, 6, 7, 8, 9, 10] + [0] * 10
    assert got["positions"] == [4, 0, 1, 2, 3, 4] + [0] * 10
    assert got["slot_mapping"] == host.slot_mapping.tolist() + [0] * 10  # padding: block 0
    assert got["seq_lens"] == [5, 5, 1, 1]
    assert got["query_start_loc"] == [0, 1, 6, 6, 6]  # padding requests own no token
    assert got["logits_indices"] == [0, 0, 0, 0]  # a's row 0, then padding
    assert inputs.views["seq_lens"].dtype == torch.int32
    assert (staging[layout.words:] == -7).all()  # nothing written past the layout


def test_a_decode_step_copies_only_what_changes_and_keeps_its_constant_rows() -> None:
    kv = PagedKVManager(num_blocks=8, block_size=4)
    seqs = [_seq("a", [1, 2, 3], computed=2), _seq("b", [4, 5, 6, 7, 8], computed=4),
            _seq("c", [9, 10], computed=1)]
    for s in seqs:
        assert kv.allocate(s.request_id, len(s.prompt_token_ids))
    host = plan_batch([ScheduledRow(s, 1, True) for s in seqs], kv)
    layout = InputLayout(tokens=4, slots=4, decode=True)
    assert layout.copied == layout.offsets["query_start_loc"] < layout.words
    staging = np.full(layout.words, -7, dtype=np.int64)
    stage_decode(layout.views(staging), host)
    assert (staging[layout.copied:] == -7).all()
    inputs = GraphInputs(layout, torch.device("cpu"))
    inputs.copy_from(torch.from_numpy(staging))
    got = {k: v.tolist() for k, v in inputs.views.items()}
    assert got["input_ids"] == [3, 8, 10, 0]
    assert got["positions"] == [2, 4, 1, 0]
    assert got["slot_mapping"] == [*host.slot_mapping.tolist(), 0]
    assert got["seq_lens"] == [3, 5, 2, 1]  # the padding row sees one token
    assert got["query_start_loc"] == [0, 1, 2, 3, 4]  # request b owns token b ...
    assert got["logits_indices"] == [0, 1, 2, 3]  # ... and samples it


@pytest.mark.parametrize("tokens,slots,decode", [
    (1, 1, True), (2, 2, True), (3, 3, True), (16, 16, True), (512, 512, True),
    (16, 16, False), (17, 7, False), (2048, 512, False), (1, 1, False)])
def test_each_input_starts_on_16_bytes_and_none_overlap(tokens: int, slots: int,
                                                        decode: bool) -> None:
    layout = InputLayout(tokens, slots, decode)
    buffer = torch.arange(layout.words, dtype=torch.int64)
    views = layout.views(buffer)
    spans = []
    for field, view in views.items():
        start = view.data_ptr() - buffer.data_ptr()
        assert start % 16 == 0, field  # Triton specializes pointers on 16-byte alignment
        assert len(view) == (tokens if field in ("input_ids", "positions", "slot_mapping")
                             else slots + (field == "query_start_loc"))
        spans.append((start, start + view.numel() * view.element_size()))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert spans[-1][1] <= layout.words * 8


def test_dummy_weights_need_no_files_and_depend_only_on_the_config(tmp_path: Path,
                                                                   qwen3_dir: Path) -> None:
    from openinfer_core import LLM, SamplingParams

    (tmp_path / "config.json").write_text((qwen3_dir / "config.json").read_text())
    assert not list(tmp_path.glob("*.safetensors"))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = []
    for _ in range(2):
        llm = LLM(tmp_path, tokenizer=qwen3_dir, device="cpu", load_format="dummy",
                  num_kv_blocks=32)
        outs.append(llm.generate(["hello"], params)[0].outputs[0].token_ids)
    assert len(outs[0]) == 6 and outs[0] == outs[1]
    vocab = json.loads((qwen3_dir / "config.json").read_text())["vocab_size"]
    assert all(0 <= t < vocab for t in outs[0])


def test_the_warm_up_ladder_runs_token_counts_on_and_off_the_16_grid() -> None:
    from openinfer_core.startup.eager_warmup import ladder_shapes

    shapes = ladder_shapes(8192, 2048, 512)
    assert shapes == [(1024, 2048), (1023, 2047), (2048, 2048), (2047, 2047), (4096, 2048),
                      (4095, 2047), (8192, 2048), (8191, 2047)]
    assert ladder_shapes(100, 64, 0) == [(2, 64), (1, 63), (4, 64), (3, 63), (8, 64), (7, 63),
                                         (16, 64), (15, 63), (32, 64), (31, 63), (64, 64),
                                         (63, 63)]
    assert ladder_shapes(8192, 2048, 8192) == []  # every step in a graph
