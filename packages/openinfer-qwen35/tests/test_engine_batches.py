"""The batches the engine builds besides its scheduled steps, through the Qwen3.5 model on
CPU: start-up's scratch batches (the memory profile's step and the eager warm-up's, in a
scratch cache of at most `SCRATCH_STATE_SLOTS` slots, rows sharing slots), a decode step laid
out as a CUDA graph's (padding rows on slot 0 at position 0), and the pools sized by the
engine's rules (`openinfer_kvcache.group_pool_blocks`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from checkpoints import write_causal_lm
from harness import Harness

from openinfer_core import EngineConfig
from openinfer_core.engine.cuda_graphs import padded_slots
from openinfer_core.interfaces.kv import SCRATCH_STATE_SLOTS, GroupedKV, KVStepLimits
from openinfer_core.interfaces.model import ForwardBatch, LoadOptions
from openinfer_core.model_config import read_model_config
from openinfer_core.startup.eager_warmup import warm_up_batches
from openinfer_core.startup.memory_budget import profile_batch
from openinfer_kernels.attention.backend import TorchAttentionBackend
from openinfer_qwen35.model import Qwen35Model
from openinfer_qwen35.model_line import Qwen35ModelLine
from openinfer_qwen35.state_cache import StateCache

BLOCK = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Qwen35Model:
    folder: Path = tmp_path_factory.mktemp("qwen35-batches")
    write_causal_lm(folder, tie=True, seed=2)
    options = LoadOptions(device=torch.device("cpu"), dtype=torch.float32,
                          attention=TorchAttentionBackend(), max_model_len=64)
    return Qwen35ModelLine.load(folder, read_model_config(folder), options)


def test_pools_follow_the_engine_rules(model: Qwen35Model) -> None:
    limits = KVStepLimits(max_num_seqs=6, max_num_batched_tokens=64)
    slot = StateCache.bytes_per_slot(model.cfg, torch.float32)
    assert model.kv_window_bytes(BLOCK, limits) == (6 + 1) * slot
    kv = model.create_kv_cache(40, BLOCK, limits)
    assert isinstance(kv, GroupedKV)
    assert [(u.name, u.total) for u in kv.group_usage()] == [("attention", 39),
                                                              ("linear_state", 6)]
    assert model.state is not None and model.state.num_slots == 7
    model.create_kv_cache(40, BLOCK)  # a scratch cache: no limits
    assert model.state.num_slots == SCRATCH_STATE_SLOTS


def test_scratch_batches_run(model: Qwen35Model) -> None:
    """The profile's step (three rows of 64 tokens and one of 8, in blocks 1..50: slots 1 and
    8, three rows sharing slot 8) and the warm-up's steps (every row in block 0: slot 0)."""
    config = EngineConfig(model="unused", device="cpu", block_size=BLOCK, max_num_seqs=8,
                          max_num_batched_tokens=200)
    profile = profile_batch(config, model)
    assert profile.group_block_tables[1][:, 0].tolist() == [1, 8, 8, 8]
    model.create_kv_cache(int(profile.block_tables.max()) + 1, BLOCK)
    batches = [profile.to_device(model.device), *warm_up_batches(config, model, 0)]
    assert len(batches) > 1
    with torch.inference_mode():
        for batch in batches:
            logits = model.forward(batch)
            assert logits.shape == (len(batch.logits_indices), model.vocab_size)
            assert torch.isfinite(logits).all()


def test_a_decode_step_padded_as_a_cuda_graph(model: Qwen35Model) -> None:
    """Two requests' decode step, then the same step with two padding rows (token 0 at
    position 0 in block 0, on slot 0): the real rows' logits and slots are the same (to fp32
    rounding), and no slot but the padding slot changes."""
    outputs = []
    for padding in (0, 2):
        h = Harness(model, num_slots=5)
        h.step([("a", [5, 6, 7, 8, 9]), ("b", [11, 12])])
        plain = decode_batch(h, [("a", 3), ("b", 4)])
        before = model.state.recurrent.clone()  # type: ignore[union-attr]
        with torch.no_grad():
            logits = model.forward(pad_decode(plain, padding))[:2]
        assert model.state is not None
        changed = (model.state.recurrent != before).flatten(2).any(-1).any(0)
        outputs.append((logits, model.state.recurrent[:, 1:].clone(),
                        changed.nonzero().flatten().tolist()))
    (logits, states, changed), (logits_p, states_p, changed_p) = outputs
    # Not bit-equal: a GEMM of four rows may sum in another order than one of two.
    torch.testing.assert_close(logits_p, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states_p, states, atol=1e-5, rtol=1e-5)
    assert changed == [1, 2] and set(changed_p) <= {0, 1, 2}


def decode_batch(h: Harness, rows: list[tuple[str, int]]) -> ForwardBatch:
    """One token per row after each request's computed tokens, as `Harness.step` lays out."""
    ids, positions, slots, lens, tables, state = [], [], [], [], [], []
    for rid, token in rows:
        req = h.requests[rid]
        pos = req.computed
        ids.append(token)
        positions.append(pos)
        slots.append(req.blocks[pos // BLOCK] * BLOCK + pos % BLOCK)
        lens.append(pos + 1)
        tables.append(req.blocks)
        state.append([req.slot])
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qsl = torch.arange(len(rows) + 1, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return ForwardBatch(
        input_ids=torch.tensor(ids), positions=torch.tensor(positions),
        slot_mapping=torch.tensor(slots), query_start_loc=qsl, seq_lens=seq_lens,
        block_tables=block_tables, logits_indices=torch.arange(len(rows)), max_query_len=1,
        max_seq_len=max(lens), query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
        block_tables_cpu=block_tables,
        group_block_tables=(block_tables, torch.tensor(state, dtype=torch.int32)))


def pad_decode(batch: ForwardBatch, padding: int) -> ForwardBatch:
    """`batch` with `padding` rows more, as `engine.graph_inputs.stage_decode` and
    `cuda_graphs.padded_slots` lay a decode graph's padding rows out."""
    if not padding:
        return batch
    rows = batch.num_seqs + padding

    def grow(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.cat([t, t.new_full((padding, *t.shape[1:]), fill)])

    tables = grow(batch.block_tables, 0)
    seq_lens = grow(batch.seq_lens, 1)
    qsl = torch.arange(rows + 1, dtype=torch.int32)
    slots = torch.from_numpy(padded_slots(batch.group_table(1).numpy(), rows))
    return ForwardBatch(
        input_ids=grow(batch.input_ids, 0), positions=grow(batch.positions, 0),
        slot_mapping=grow(batch.slot_mapping, 0), query_start_loc=qsl, seq_lens=seq_lens,
        block_tables=tables, logits_indices=torch.arange(rows), max_query_len=1,
        max_seq_len=batch.max_seq_len, query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens,
        block_tables_cpu=tables, group_block_tables=(tables, slots))
