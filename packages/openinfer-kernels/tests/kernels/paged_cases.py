"""Paged attention cases shared by the kernel and backend tests: a batch of requests laid out in
a paged cache as the engine lays it out (shuffled block ids, tables padded with block 0, NaN in
every slot outside a request's context, so any stray read poisons the output), and the check of
an output against `paged_attention_ref`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openinfer_core.interfaces.model import ForwardBatch
from openinfer_kernels.attention import paged_attention_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Kernel against reference, both computing in fp32 and rounding once to the output dtype:
# fp32 differs only by summation order and exp2 vs exp (seen: ~5e-7).
# bf16 the two roundings can land one bf16 ulp apart (2^-8 relative), and the kernel also
# rounds the softmax probabilities to bf16 before the PV product, as FlashAttention does
# (up to 2^-9 of max|v| absolute): torch's bf16 rtol, and an atol for outputs near zero.
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
       torch.float16: dict(rtol=2e-3, atol=2e-3)}  # fp16: the bf16 reasoning, 8x finer

@dataclass(frozen=True)
class Req:
    context: int  # seq_len after this step
    queries: int  # this step's tokens, the last `queries` of the context


def decodes(*contexts: int) -> list[Req]:
    return [Req(context=c, queries=1) for c in contexts]


@dataclass
class Case:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, page, Hk, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, width] int32, padded with 0
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    slots: list[torch.Tensor]  # per request, the flat cache slot of each context position
    keys: list[torch.Tensor]  # per request, contiguous [L, Hk, D]
    values: list[torch.Tensor]

    def args(self, scale: float) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.seq_lens,
                self.query_start_loc, scale)

    @property
    def max_query_len(self) -> int:
        return int((self.query_start_loc[1:] - self.query_start_loc[:-1]).max())


def build(reqs: list[Req], hq: int, hk: int, d: int, dtype: torch.dtype, *, page: int = 16,
          seed: int = 0, cached_upto: list[int] | None = None, num_blocks: int | None = None,
          width: int | None = None) -> Case:
    """Random q/K/V on DEVICE; the cache holds positions [0, cached_upto[b]) of request b
    (default: its whole context), NaN elsewhere."""
    g = torch.Generator().manual_seed(seed)
    needed = [-(-r.context // page) for r in reqs]
    num_blocks = num_blocks or sum(needed) + 3  # the padding block and two nobody owns
    ids = torch.randperm(num_blocks - 1, generator=g) + 1
    tables, used = [], 0
    for n in needed:
        tables.append(ids[used:used + n])
        used += n
    width = width or max(needed)
    block_tables = torch.zeros(len(reqs), width, dtype=torch.int32)
    for b, table in enumerate(tables):
        block_tables[b, :len(table)] = table

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)

    k_cache = torch.full((num_blocks, page, hk, d), float("nan"), dtype=dtype, device=DEVICE)
    v_cache = k_cache.clone()
    slots, keys, values = [], [], []
    for b, r in enumerate(reqs):
        pos = torch.arange(r.context)
        slots.append((tables[b][pos // page] * page + pos % page).to(DEVICE))
        keys.append(randn(r.context, hk, d))
        values.append(randn(r.context, hk, d))
        upto = r.context if cached_upto is None else cached_upto[b]
        k_cache.view(-1, hk, d)[slots[b][:upto]] = keys[b][:upto]
        v_cache.view(-1, hk, d)[slots[b][:upto]] = values[b][:upto]
    starts = torch.tensor([0] + [r.queries for r in reqs]).cumsum(0)
    return Case(randn(int(starts[-1]), hq, d), k_cache, v_cache, block_tables.to(DEVICE),
                torch.tensor([r.context for r in reqs], dtype=torch.int32, device=DEVICE),
                starts.to(torch.int32).to(DEVICE), slots, keys, values)


def check(out: torch.Tensor, case: Case, scale: float) -> None:
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    assert torch.isfinite(out).all(), "read a slot outside some request's context"
    want = paged_attention_ref(*case.args(scale))
    torch.testing.assert_close(out, want, **TOL[case.q.dtype])


def step_batch(reqs: list[Req], hq: int, hk: int, d: int, dtype: torch.dtype,
               seed: int) -> tuple[Case, torch.Tensor, torch.Tensor, ForwardBatch]:
    """A step as a backend gets it: the cache holds each request's context before this step,
    and this step's K/V ([T, Hk, D]) and `ForwardBatch` say where to append the rest."""
    prefixes = [r.context - r.queries for r in reqs]
    case = build(reqs, hq, hk, d, dtype, seed=seed, cached_upto=prefixes)
    step = [torch.arange(p, r.context) for p, r in zip(prefixes, reqs, strict=True)]
    k_step = torch.cat([k[s] for k, s in zip(case.keys, step, strict=True)])
    v_step = torch.cat([v[s] for v, s in zip(case.values, step, strict=True)])
    batch = ForwardBatch(
        input_ids=torch.zeros(k_step.shape[0], dtype=torch.int64, device=DEVICE),
        positions=torch.cat(step).to(DEVICE),
        slot_mapping=torch.cat([sl[s] for sl, s in zip(case.slots, step, strict=True)]),
        query_start_loc=case.query_start_loc,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        logits_indices=case.query_start_loc[1:].long() - 1,
        max_query_len=case.max_query_len,
        max_seq_len=max(r.context for r in reqs),
    )
    return case, k_step, v_step, batch


def check_appended(case: Case) -> None:
    """The whole context of every request is in the cache now."""
    hk, d = case.k_cache.shape[2:]
    for b, slots in enumerate(case.slots):
        assert torch.equal(case.k_cache.view(-1, hk, d)[slots], case.keys[b])
        assert torch.equal(case.v_cache.view(-1, hk, d)[slots], case.values[b])


DECODES = {
    "b1-first-token": decodes(1),
    "b3-around-a-page": decodes(15, 16, 17),
    "b7-mixed-lengths": decodes(1, 15, 16, 17, 100, 300, 33),
}
PREFILLS = {
    "prompt-80": [Req(context=80, queries=80)],  # a full 64-row tile, then a partial one
    "prompts-17-1-40": [Req(context=17, queries=17), Req(context=1, queries=1),
                        Req(context=40, queries=40)],
    "chunk-63-after-62": [Req(context=125, queries=63)],  # the first row must not see key 63
    "mixed": [Req(context=9, queries=1), Req(context=7, queries=7), Req(context=45, queries=29),
              Req(context=16, queries=1), Req(context=100, queries=3)],
}


SHORT_QUERIES = {
    "prefix-hit-16-of-300": [Req(context=300, queries=16)],  # a warm prefix: 284 cached
    "hit-5-of-130": [Req(context=130, queries=5)],  # fewer queries than a query block
    "chunk-40-after-60": [Req(context=100, queries=40)],  # several query blocks
    "hits-and-decodes": [Req(57, 1), Req(200, 16), Req(33, 33), Req(17, 1), Req(90, 9)],
}


QWEN3_4B = dict(hq=32, hk=8, d=128)
LARGE = {
    "decode-b1-4k": decodes(4096),
    "decode-b1-32k": decodes(32768),
    "decode-b64-1k-2k": decodes(*torch.randint(1000, 2001, (64,),
                                               generator=torch.Generator().manual_seed(0))
                                .tolist()),
    "prefill-2048": [Req(context=2048, queries=2048)],
    "prefills-500-700-848": [Req(500, 500), Req(700, 700), Req(848, 848)],
    "chunk-512-after-4096": [Req(context=4608, queries=512)],
    "mixed-chunk-and-decodes": [Req(4608, 512), *decodes(1, 17, 3000, 200), Req(300, 300)],
    "prefix-hit-16-of-16384": [Req(context=16384, queries=16)],
    "hits-and-decodes-4k": [Req(4096, 16), *decodes(1, 2000, 700), Req(900, 64), Req(64, 64)],
}
