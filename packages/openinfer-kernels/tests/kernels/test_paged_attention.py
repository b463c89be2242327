"""paged_attention against torch's scaled_dot_product_attention on each request's contiguous
K/V in float64, and the `torch` attention backend (append, then attend) end to end.

The paged cache is built by hand: block ids shuffled across requests, tables padded with the
padding block 0, and every slot outside a request's context filled with NaN, so reading a slot
it should not (a stale tail, another request's block, the padding block) poisons the output."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import openinfer_kernels
from openinfer_core.interfaces.attention import AttentionBackend
from openinfer_core.interfaces.model import ForwardBatch
from openinfer_kernels.attention import paged_attention_ref
from openinfer_kernels.attention.backend import TorchAttentionBackend

BLOCK_SIZE = 4

# fp32: softmax and two D- and L-term dot products in fp32 against float64 (seen: ~1e-6).
# bf16: the reference rounds its output once into 8 significant bits (seen: 2^-8 relative); the
# bound is torch's bf16 default, 1.6e-2, because a GPU kernel that also rounds the softmax
# probabilities to bf16 before the PV product must pass the same test.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5)}


@dataclass(frozen=True)
class Req:
    context: int  # seq_len after this step
    queries: int  # this step's tokens, the last `queries` of the context


MIXED = [
    Req(context=9, queries=1),  # decode
    Req(context=7, queries=7),  # prefill from zero, last block partly filled
    Req(context=13, queries=5),  # chunk attending to an 8-token cached prefix
    Req(context=8, queries=1),  # decode whose token ends a block
    Req(context=1, queries=1),  # a one-token prompt
]
BATCHES = {
    "mixed": MIXED,
    "t1": [Req(context=1, queries=1)],
    "t63-prefill": [Req(context=63, queries=63)],
    "t63-chunk-after-20": [Req(context=83, queries=63), Req(context=30, queries=1)],
}
HEADS = [(5, 1, 60), (4, 2, 24), (3, 3, 128)]
HEAD_IDS = ["gqa5-1-d60", "gqa4-2-d24", "mha3-d128"]


@dataclass
class Case:
    q: torch.Tensor  # [T, Hq, D]
    keys: list[torch.Tensor]  # per request, contiguous [L, Hk, D]
    values: list[torch.Tensor]
    k_cache: torch.Tensor  # [num_blocks, BLOCK_SIZE, Hk, D]
    v_cache: torch.Tensor
    tables: list[list[int]]
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32


def slot(table: list[int], position: int) -> int:
    return table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE


def build(reqs: list[Req], hq: int, hk: int, d: int, dtype: torch.dtype, seed: int = 0,
          cached_upto: list[int] | None = None) -> Case:
    """Random q/K/V; the cache holds tokens [0, cached_upto[b]) of request b (default: all)."""
    g = torch.Generator().manual_seed(seed)
    needed = [-(-r.context // BLOCK_SIZE) for r in reqs]
    num_blocks = sum(needed) + 3  # the padding block and two that no request owns
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables = []
    for n in needed:
        tables.append(ids[:n])
        ids = ids[n:]

    q = torch.randn(sum(r.queries for r in reqs), hq, d, generator=g).to(dtype)
    keys = [torch.randn(r.context, hk, d, generator=g).to(dtype) for r in reqs]
    values = [torch.randn(r.context, hk, d, generator=g).to(dtype) for r in reqs]
    k_cache = torch.full((num_blocks, BLOCK_SIZE, hk, d), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    for b, table in enumerate(tables):
        for pos in range(reqs[b].context if cached_upto is None else cached_upto[b]):
            block, offset = divmod(slot(table, pos), BLOCK_SIZE)
            k_cache[block, offset] = keys[b][pos]
            v_cache[block, offset] = values[b][pos]

    width = max(needed)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = [0]
    for r in reqs:
        starts.append(starts[-1] + r.queries)
    return Case(q, keys, values, k_cache, v_cache, tables, block_tables,
                torch.tensor([r.context for r in reqs], dtype=torch.int32),
                torch.tensor(starts, dtype=torch.int32))


def oracle(case: Case, scale: float) -> torch.Tensor:
    """Per request: SDPA in float64 over contiguous K/V, GQA by repeating kv heads, and a causal
    mask shifted right by the cached prefix (query i of n sees keys 0..L - n + i)."""
    out = torch.empty(case.q.shape, dtype=torch.float64)
    starts = case.query_start_loc.tolist()
    group = case.q.shape[1] // case.keys[0].shape[1]
    for b, (keys, values) in enumerate(zip(case.keys, case.values, strict=True)):
        lo, hi = starts[b], starts[b + 1]
        n, length = hi - lo, keys.shape[0]
        q = case.q[lo:hi].double().transpose(0, 1)  # [Hq, n, D]
        k = keys.double().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
        v = values.double().repeat_interleave(group, dim=1).transpose(0, 1)
        allowed = torch.ones(n, length, dtype=torch.bool).tril(diagonal=length - n)
        out[lo:hi] = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                                    scale=scale).transpose(0, 1)
    return out


def run_ref(case: Case, scale: float) -> torch.Tensor:
    return paged_attention_ref(case.q, case.k_cache, case.v_cache, case.block_tables,
                               case.seq_lens, case.query_start_loc, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("hq", "hk", "d"), HEADS, ids=HEAD_IDS)
@pytest.mark.parametrize("batch", list(BATCHES))
def test_matches_sdpa_on_contiguous_kv(batch, hq, hk, d, dtype):
    case = build(BATCHES[batch], hq, hk, d, dtype)
    out = run_ref(case, d**-0.5)
    assert out.shape == case.q.shape and out.dtype == dtype
    assert torch.isfinite(out).all(), "read a slot outside some request's context"
    torch.testing.assert_close(out.double(), oracle(case, d**-0.5), **TOL[dtype])


def test_scale_is_the_one_given():
    # Not necessarily 1/sqrt(D): e.g. models with a query_pre_attn_scalar.
    case = build(MIXED, 4, 2, 24, torch.float32, seed=1)
    torch.testing.assert_close(run_ref(case, 0.3).double(), oracle(case, 0.3),
                               **TOL[torch.float32])


def test_a_request_without_queries_is_skipped():
    with_idle = [MIXED[0], Req(context=6, queries=0), *MIXED[1:]]
    case = build(with_idle, 4, 2, 24, torch.float32, seed=2)
    out = run_ref(case, 24**-0.5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), oracle(case, 24**-0.5), **TOL[torch.float32])


def test_first_decode_query_sees_only_the_first_key():
    # One token of context: softmax over a single key, so the output is exactly its value.
    case = build([Req(context=1, queries=1)], 3, 3, 24, torch.float32, seed=3)
    assert torch.equal(run_ref(case, 0.2), case.values[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_public_op_on_cpu_is_the_reference(dtype):
    case = build(MIXED, 5, 1, 60, dtype, seed=4)
    got = openinfer_kernels.paged_attention(case.q, case.k_cache, case.v_cache,
                                            case.block_tables, case.seq_lens,
                                            case.query_start_loc, 60**-0.5)
    assert torch.equal(got, run_ref(case, 60**-0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("hq", "hk", "d"), HEADS, ids=HEAD_IDS)
def test_torch_backend_appends_then_attends(hq, hk, d, dtype):
    # The cache holds only each request's prefix; this step's K/V arrive through `attend`.
    prefixes = [r.context - r.queries for r in MIXED]
    case = build(MIXED, hq, hk, d, dtype, seed=5, cached_upto=prefixes)
    k_step = torch.cat([keys[p:] for keys, p in zip(case.keys, prefixes, strict=True)])
    v_step = torch.cat([vals[p:] for vals, p in zip(case.values, prefixes, strict=True)])
    positions = [pos for r in MIXED for pos in range(r.context - r.queries, r.context)]
    owners = [b for b, r in enumerate(MIXED) for _ in range(r.queries)]
    slots = [slot(case.tables[b], pos) for b, pos in zip(owners, positions, strict=True)]
    batch = ForwardBatch(
        input_ids=torch.zeros(len(positions), dtype=torch.int64),
        positions=torch.tensor(positions),
        slot_mapping=torch.tensor(slots),
        query_start_loc=case.query_start_loc,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        logits_indices=case.query_start_loc[1:].long() - 1,
        max_query_len=max(r.queries for r in MIXED),
        max_seq_len=max(r.context for r in MIXED),
    )
    expected_k, expected_v = case.k_cache.clone(), case.v_cache.clone()
    for t, s in enumerate(slots):
        expected_k[divmod(s, BLOCK_SIZE)] = k_step[t]
        expected_v[divmod(s, BLOCK_SIZE)] = v_step[t]

    backend = TorchAttentionBackend()
    assert isinstance(backend, AttentionBackend) and backend.name == "torch"
    out = backend.attend(case.q, k_step, v_step, case.k_cache, case.v_cache, batch, d**-0.5)

    # Exactly this step's slots were written; everything else (NaN included) is as it was.
    exact = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(case.k_cache, expected_k, **exact)
    torch.testing.assert_close(case.v_cache, expected_v, **exact)
    assert out.shape == case.q.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), oracle(case, d**-0.5), **TOL[dtype])
