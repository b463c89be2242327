"""The contract a captured mixed step needs (`SupportsCudaGraphs.cuda_graph_max_tokens`, which
`OPENINFER_DSV4_GRAPH_TOKENS` sets; 0 by default until measured on a GPU):
a step of prefill chunks beside decodes, run again as a CUDA graph would lay it out (padded to
a bucket of T tokens over S request slots, `max_query_len` = T, `max_seq_len` = the model's
longest, every table as wide as the model allows; padding tokens at position 0 writing into
block 0, padding requests owning no token) gives its rows the same logits. On CPU, at the
tiny config, through the references; the Triton kernels' paths by token count are the GPU
gate's to check."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from dsv4_checkpoints import write_model_folder
from test_engine import engine, greedy_requests, prompts

from openinfer_core.interfaces.model import ForwardBatch
from openinfer_core.testing import run_staggered


def _as_graph(batch: ForwardBatch, tokens: int, slots: int, max_len: int,
              max_blocks: int) -> ForwardBatch:
    t, b = batch.input_ids.shape[0], batch.seq_lens.shape[0]

    def pad(x: torch.Tensor, n: int, fill: int) -> torch.Tensor:
        return torch.cat([x, x.new_full((n - x.shape[0], *x.shape[1:]), fill)])

    def table(x: torch.Tensor) -> torch.Tensor:
        wide = x.new_zeros((slots, max_blocks) if x.shape[1] > 1 else (slots, 1))
        wide[:b, :x.shape[1]] = x
        return wide

    return dataclasses.replace(
        batch, input_ids=pad(batch.input_ids, tokens, 0),
        positions=pad(batch.positions, tokens, 0), slot_mapping=pad(batch.slot_mapping, tokens, 0),
        query_start_loc=pad(batch.query_start_loc, slots + 1, t),
        seq_lens=pad(batch.seq_lens, slots, 1), block_tables=table(batch.block_tables),
        group_block_tables=tuple(table(g) for g in batch.group_block_tables),
        max_query_len=tokens, max_seq_len=max_len, query_start_loc_cpu=None, seq_lens_cpu=None,
        block_tables_cpu=None, host=None)


@pytest.fixture(scope="module")
def folder(model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    return write_model_folder(model, tmp_path_factory.mktemp("dsv4") / "tiny")


def test_mixed_steps_laid_out_as_a_graph_give_the_same_logits(folder: Path) -> None:
    eng = engine(folder, max_num_batched_tokens=24, max_num_seqs=4)
    model = eng.model
    forward = model.forward
    max_blocks = -(-model.max_model_len // eng.config.block_size)
    checked = []

    def twice(batch: ForwardBatch) -> torch.Tensor:
        out = forward(batch)
        t = batch.input_ids.shape[0]
        if batch.max_query_len > 1 and t > 1:
            bucket = 32
            again = forward(_as_graph(batch, bucket, min(bucket, 8), model.max_model_len,
                                      max_blocks))
            rows = batch.logits_indices.shape[0]
            torch.testing.assert_close(again[:rows], out, rtol=1e-5, atol=1e-5)
            checked.append(t)
        return out

    model.forward = twice  # type: ignore[method-assign]
    run_staggered(eng, greedy_requests(prompts(4, 7, (10, 40)), "g", n=6), lambda i: i)
    assert len(checked) >= 3, checked


def test_the_variable_sets_the_mixed_graphs_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    from openinfer_deepseek_v4.model import GRAPH_TOKENS_ENV, graph_tokens

    assert graph_tokens() == 0
    monkeypatch.setenv(GRAPH_TOKENS_ENV, "512")
    assert graph_tokens() == 512
    monkeypatch.setenv(GRAPH_TOKENS_ENV, "many")
    with pytest.raises(ValueError, match="a token count"):
        graph_tokens()


def test_the_start_up_warm_up_steps_run(folder: Path) -> None:
    """Every eager warm-up step start-up runs (`startup.eager_warmup`: the ladder, and the
    mixed steps of decodes at a longer length beside a prompt chunk, in the padding block 0)
    runs on the scratch KV cache start-up gives them, with finite logits."""
    from openinfer_core.startup.eager_warmup import warm_up_batches
    from openinfer_core.startup.memory_budget import profile_batch

    eng = engine(folder, max_num_batched_tokens=64, max_num_seqs=4)
    model = eng.model
    profile = profile_batch(eng.config, model)
    model.create_kv_cache(int(profile.block_tables.max()) + 1, eng.config.block_size)
    batches = warm_up_batches(eng.config, model, 0)
    assert any(int(b.seq_lens.max()) > int(b.query_start_loc.diff().min()) for b in batches)
    with torch.inference_mode():
        for batch in batches:
            logits = model.forward(batch)
            assert logits.shape == (len(batch.logits_indices), model.vocab_size)
            assert torch.isfinite(logits).all()
