"""The Triton paged attention kernels against `paged_attention_ref`: the split-context decode
kernel, the varlen prefill kernel (with a cached prefix, and decode rows among prefill rows), and
the `triton` backend. On CPU they run under the Triton interpreter with few heads and short
contexts; `-m gpu` adds Qwen3-4B shapes (Hq=32, Hk=8, D=128) and a CUDA-graph replay.

Caches are built as the engine builds them: shuffled block ids, tables padded with block 0, and
NaN in every slot outside a request's context, so any stray read poisons the output
(`paged_cases.py`)."""

from __future__ import annotations

import pytest
import torch
from paged_cases import (
    DECODES,
    DEVICE,
    LARGE,
    PREFILLS,
    QWEN3_4B,
    SHORT_QUERIES,
    Req,
    build,
    check,
    check_appended,
    decodes,
    step_batch,
)

import openinfer_kernels
import openinfer_kernels.attention.split as split_module
from openinfer_core.interfaces.attention import AttentionBackend
from openinfer_kernels.attention.prefill import PrefillConfig, launch_prefill, paged_prefill
from openinfer_kernels.attention.split import (
    SplitConfig,
    launch_split,
    paged_decode,
    paged_split,
    split_tiles,
)
from openinfer_kernels.attention.triton import (
    SPLIT_MAX_QUERIES,
    SPLIT_MAX_TOKENS,
    paged_attention_triton,
)
from openinfer_kernels.attention.triton_backend import TritonAttentionBackend
from openinfer_kernels.kv_store import kv_append
from openinfer_kernels.split_k import split_counters

gpu = pytest.mark.gpu
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
HEADS = pytest.mark.parametrize(("hq", "hk", "d"), [(5, 1, 60), (4, 2, 24), (2, 2, 64)],
                                ids=["gqa5-1-d60", "gqa4-2-d24", "mha2-d64"])


@DTYPES
@HEADS
@pytest.mark.parametrize("batch", list(DECODES))
def test_decode_matches_reference(batch, hq, hk, d, dtype):
    case = build(DECODES[batch], hq, hk, d, dtype)
    check(paged_decode(*case.args(d**-0.5)), case, d**-0.5)


@DTYPES
@HEADS
@pytest.mark.parametrize("batch", list(PREFILLS))
def test_prefill_matches_reference(batch, hq, hk, d, dtype):
    case = build(PREFILLS[batch], hq, hk, d, dtype)
    check(paged_prefill(*case.args(d**-0.5), case.max_query_len), case, d**-0.5)


@pytest.mark.parametrize("num_splits", [1, 2, 3, 16])
def test_decode_splits_the_context_any_number_of_ways(num_splits):
    # 16 splits of a 17-token context: one page each, so most splits are empty.
    case = build(decodes(17, 300, 1, 64), 4, 2, 24, torch.float32, seed=1)
    check(launch_split(*case.args(0.2), 1, SplitConfig(num_splits=num_splits)), case, 0.2)


@pytest.mark.parametrize("page", [16, 32])
@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_page_sizes(kernel, page):
    reqs = decodes(31, 33, 64, 97) if kernel == "decode" else PREFILLS["mixed"]
    case = build(reqs, 4, 2, 24, torch.float32, page=page, seed=2)
    out = paged_attention_triton(*case.args(0.2), max_query_len=case.max_query_len)
    check(out, case, 0.2)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_a_request_without_queries_is_skipped(kernel):
    reqs = decodes(9, 30) if kernel == "decode" else PREFILLS["mixed"][:2]
    case = build([reqs[0], Req(context=6, queries=0), reqs[1]], 4, 2, 24, torch.float32, seed=3)
    out = paged_attention_triton(*case.args(0.2), max_query_len=case.max_query_len)
    check(out, case, 0.2)


def test_head_dim_128_and_gqa_8_8():
    case = build(PREFILLS["mixed"], 8, 8, 128, torch.bfloat16, seed=4)
    check(paged_attention_triton(*case.args(0.1)), case, 0.1)


def test_wrapper_reads_max_query_len_when_not_given():
    for reqs in (decodes(5, 40), PREFILLS["mixed"]):
        case = build(reqs, 4, 2, 24, torch.float32, seed=5)
        check(paged_attention_triton(*case.args(0.3)), case, 0.3)


def test_an_empty_batch_returns_an_empty_output():
    case = build(decodes(5), 4, 2, 24, torch.float32)
    empty = case.q[:0]
    for max_query_len in (0, 1, 7):
        out = paged_attention_triton(empty, case.k_cache, case.v_cache, case.block_tables[:0],
                                     case.seq_lens[:0], case.query_start_loc[:1], 0.3,
                                     max_query_len=max_query_len)
        assert out.shape == (0, 4, 24)


@DTYPES
def test_triton_backend_appends_then_attends(dtype):
    case, k_step, v_step, batch = step_batch(PREFILLS["mixed"], 4, 2, 24, dtype, seed=6)
    backend = TritonAttentionBackend()
    assert isinstance(backend, AttentionBackend) and backend.name == "triton"
    out = backend.attend(case.q, k_step, v_step, case.k_cache, case.v_cache, batch, 0.2)
    check_appended(case)
    check(out, case, 0.2)


def test_triton_backend_attends_over_what_the_model_appended():
    # The model's fused norm/rotary kernel wrote this step's K/V: attend_appended only reads.
    case, k_step, v_step, batch = step_batch(PREFILLS["mixed"], 4, 2, 24, torch.float32, seed=7)
    kv_append(k_step, v_step, case.k_cache, case.v_cache, batch.slot_mapping)
    k_before = case.k_cache.clone()
    out = TritonAttentionBackend().attend_appended(case.q, case.k_cache, case.v_cache, batch, 0.2)
    assert torch.equal(case.k_cache.nan_to_num(), k_before.nan_to_num())
    check(out, case, 0.2)




@DTYPES
@HEADS
@pytest.mark.parametrize("batch", list(SHORT_QUERIES))
def test_split_kernel_with_several_queries_matches_reference(batch, hq, hk, d, dtype):
    case = build(SHORT_QUERIES[batch], hq, hk, d, dtype, seed=9)
    check(paged_split(*case.args(d**-0.5), case.max_query_len), case, d**-0.5)


@pytest.mark.parametrize("num_splits", [1, 2, 5, 16])
@pytest.mark.parametrize("max_query_len", [16, 64])
def test_split_kernel_any_splits_and_query_blocks(num_splits, max_query_len):
    # Splits past a row's position see nothing (an all-hidden split must merge as nothing);
    # max_query_len above the real one (as in a CUDA graph) gives larger query blocks.
    case = build(SHORT_QUERIES["hits-and-decodes"], 8, 2, 24, torch.float32, seed=10)
    out = launch_split(*case.args(0.2), max_query_len, SplitConfig(num_splits=num_splits))
    check(out, case, 0.2)


@pytest.mark.parametrize("tiles", [dict(rows=128), dict(rows=128, heavy_first=True),
                                   dict(heavy_first=True, block_n=32)], ids=str)
def test_prompt_tiles_and_launch_order_of_the_split_kernel(tiles):
    case = build(PREFILLS["mixed"], 8, 2, 24, torch.bfloat16, seed=12)
    check(launch_split(*case.args(0.2), case.max_query_len, SplitConfig(**tiles)), case, 0.2)


@pytest.mark.parametrize("tiles", [dict(block_m=128), dict(block_m=32, heavy_first=True),
                                   dict(block_m=128, block_n=32, heavy_first=True)], ids=str)
def test_prompt_tiles_and_launch_order_of_the_prefill_kernel(tiles):
    case = build(PREFILLS["mixed"], 8, 2, 24, torch.bfloat16, seed=13)
    check(launch_prefill(*case.args(0.2), case.max_query_len, PrefillConfig(**tiles)), case,
          0.2)


def test_a_step_of_few_tokens_runs_the_split_kernel_whatever_its_spread():
    """Up to SPLIT_MAX_TOKENS tokens, requests of more than SPLIT_MAX_QUERIES queries run the
    split kernel too (so such steps replay from CUDA graphs); it must be exact for them."""
    reqs = [Req(context=600, queries=520), Req(40, 1), Req(90, 30)]
    case = build(reqs, 4, 2, 24, torch.float32, seed=11)
    assert case.q.shape[0] <= SPLIT_MAX_TOKENS and case.max_query_len > SPLIT_MAX_QUERIES
    check(paged_split(*case.args(0.2), case.max_query_len), case, 0.2)
    check(paged_attention_triton(*case.args(0.2), max_query_len=case.max_query_len), case, 0.2)


def test_split_tiles():
    assert split_tiles(1, 4) == (1, 16)  # decode: one query, the group padded to 16 rows
    assert split_tiles(2, 4) == (16, 4)  # 64 rows for any query count: one compiled variant
    assert split_tiles(16, 4) == (16, 4)
    assert split_tiles(512, 4) == (16, 4)  # 64 rows at most
    assert split_tiles(512, 5) == (8, 8)
    assert split_tiles(512, 1) == (64, 1)
    assert split_tiles(512, 128) == (1, 128)
    assert split_tiles(2048, 4) == (16, 4)  # a graph's long steps hold decodes too


@pytest.mark.parametrize("queries", [1, 8], ids=["decode", "short"])
@pytest.mark.parametrize("num_splits", [2, 5])
def test_the_last_share_merges_the_splits_as_the_merge_kernel_does(num_splits, queries,
                                                                   monkeypatch):
    """The splits merged by their last program (OPENINFER_SPLIT_MERGE=last) against
    `_merge_kernel` (the default): the same weights in another summation order, and every
    arrival count back to 0 after the launch (a CUDA graph's next replay starts from there).
    Compiled on the GPU too, where the counting's memory ordering is real."""
    reqs = SHORT_QUERIES["hits-and-decodes"] if queries > 1 else DECODES["b7-mixed-lengths"]
    case = build(reqs, 4, 2, 24, torch.float32, seed=5)
    config = SplitConfig(num_splits=num_splits)
    monkeypatch.setattr(split_module, "LAST_MERGES", True)
    serial = launch_split(*case.args(0.2), case.max_query_len, config)
    assert not split_counters(serial.device).any()
    monkeypatch.setattr(split_module, "LAST_MERGES", False)
    merged = launch_split(*case.args(0.2), case.max_query_len, config)
    torch.testing.assert_close(serial, merged, rtol=1e-5, atol=1e-6)
    check(serial, case, 0.2)


@pytest.mark.parametrize("serial", [True, False], ids=["last-share", "merge-kernel"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_split_kernel_leaves_padding_tokens_and_requests_alone(num_splits, serial,
                                                               monkeypatch):
    monkeypatch.setattr(split_module, "LAST_MERGES", serial)
    # A CUDA graph bucket: 7 tokens more than the requests own, and 3 requests of no query.
    reqs = SHORT_QUERIES["hits-and-decodes"]
    case = build([*reqs, Req(context=1, queries=0), Req(context=1, queries=0),
                  Req(context=1, queries=0)], 4, 2, 24, torch.float32, seed=11)
    real = case.q.shape[0]
    q = torch.cat([case.q, torch.randn(7, 4, 24, device=DEVICE)])
    out = launch_split(q, *case.args(0.2)[1:], max_query_len=q.shape[0],
                       config=SplitConfig(num_splits=num_splits))
    check(out[:real], case, 0.2)
    if num_splits > 1:  # the merge zeroes rows that no request owns
        assert torch.equal(out[real:], torch.zeros_like(out[real:]))


# --- full size, on the GPU only -------------------------------------------------------------


@gpu
@pytest.mark.parametrize("batch", list(LARGE))
def test_qwen3_4b_shapes(batch):
    case = build(LARGE[batch], **QWEN3_4B, dtype=torch.bfloat16)
    out = paged_attention_triton(*case.args(128**-0.5), max_query_len=case.max_query_len)
    check(out, case, 128**-0.5)


@gpu
@pytest.mark.parametrize("batch", ["decode-b64-1k-2k", "mixed-chunk-and-decodes"])
def test_qwen3_4b_shapes_fp32(batch):
    case = build(LARGE[batch], **QWEN3_4B, dtype=torch.float32)
    out = paged_attention_triton(*case.args(128**-0.5), max_query_len=case.max_query_len)
    check(out, case, 128**-0.5)


@gpu
def test_public_op_on_cuda_is_the_kernel():
    case = build(PREFILLS["mixed"], **QWEN3_4B, dtype=torch.bfloat16)
    assert torch.equal(openinfer_kernels.paged_attention(*case.args(0.1)),
                       paged_attention_triton(*case.args(0.1)))


@gpu
def test_decode_replays_in_a_cuda_graph_with_new_lengths():
    # Same shapes, new contents: lengths across split boundaries, other blocks, other queries.
    shapes = dict(**QWEN3_4B, dtype=torch.bfloat16, num_blocks=600, width=200)
    first = build(decodes(1, 40, 300, 17, 3000), seed=7, **shapes)
    second = build(decodes(3100, 1, 16, 1000, 33), seed=8, **shapes)
    static = first.args(0.1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile outside the capture
        paged_attention_triton(*static, max_query_len=1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_triton(*static, max_query_len=1, max_seq_len=300)

    graph.replay()
    check(out.clone(), first, 0.1)
    for dst, src in zip(static[:-1], second.args(0.1)[:-1], strict=True):
        dst.copy_(src)
    graph.replay()
    check(out.clone(), second, 0.1)


@gpu
def test_short_queries_replay_in_a_cuda_graph_with_a_new_spread():
    # One 64-token bucket over 8 requests: captured with one spread of tokens, replayed with
    # another (other requests own the query blocks, two own none, 3 tokens are padding).
    shapes = dict(**QWEN3_4B, dtype=torch.bfloat16, num_blocks=700, width=300)
    first = build([Req(4096, 16), *decodes(1, 2000, 700), Req(900, 28), Req(64, 15), Req(5, 1),
                   Req(9, 1)], seed=12, **shapes)
    second = build([Req(30, 1), Req(3000, 40), Req(1, 0), Req(4100, 16), Req(2, 2),
                    Req(1, 0), Req(70, 1), Req(16, 1)], seed=13, **shapes)
    assert first.q.shape[0] == 64 and second.q.shape[0] == 61
    static = first.args(0.1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        paged_attention_triton(*static, max_query_len=64)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention_triton(*static, max_query_len=64)

    graph.replay()
    check(out.clone(), first, 0.1)
    for dst, src in zip(static[1:-1], second.args(0.1)[1:-1], strict=True):
        dst.copy_(src)
    static[0][:61].copy_(second.q)
    graph.replay()
    check(out[:61].clone(), second, 0.1)
