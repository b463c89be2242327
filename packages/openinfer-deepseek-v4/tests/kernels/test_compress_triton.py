"""The compressor's pooling kernel on the paged cache against `compress_pool_ref` (which makes
each entry with `compress_chunk_ref`), and, over a whole sequence served as a prefill then
decode steps, against `compress_kv_ref`: the entries land in the right rows, with and without
overlap, with windows that straddle blocks, at ratios 4, 8 and 128."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from openinfer_core.interfaces.kv import KVGroupSpec
from openinfer_deepseek_v4.kernels.compress import (
    compress_kv_ref,
    compress_pool_ref,
    store_and_pool_ref,
    store_projections,
    store_projections_ref,
)
from openinfer_deepseek_v4.kernels.compress.triton import (
    compress_pool_triton,
    store_and_pool_triton,
    store_projections_triton,
)
from openinfer_deepseek_v4.kernels.rotary import rope_frequencies

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
# fp32: the same math; the softmax's max and sum are taken online. bf16: both sides round at
# the same points (weights, weighted values, pooled sum, normed entry, cos/sin, rotated pairs),
# and a value rounded the other way moves the entry by about an ulp: entries are O(1) to O(8)
# here, so one ulp relative (2^-7) and 2^-5 absolute.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2**-7, atol=2**-5)}
if DEVICE == "cpu":  # the interpreter's casts truncate: up to one more ulp per rounding point
    TOL[torch.bfloat16] = dict(rtol=2**-5, atol=2**-3)


@dataclass(frozen=True, slots=True)
class Cache:
    """A paged compressor cache over a batch, its blocks shuffled."""

    projections: torch.Tensor  # [blocks, block_size, 2 c d]
    entries: torch.Tensor  # [blocks, entries_per_block, d], NaN where never written
    tables: torch.Tensor  # [B, max_blocks] int32


def make_cache(lens: list[int], block_size: int, ratio: int, c: int, d: int,
               dtype: torch.dtype, g: torch.Generator) -> Cache:
    counts = [-(-n // block_size) for n in lens]
    blocks = sum(counts) + 2  # two spare blocks nobody owns
    order = torch.randperm(blocks, generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(counts), dtype=torch.int32)
    for b, start in enumerate(torch.tensor([0, *counts]).cumsum(0)[:-1].tolist()):
        tables[b, :counts[b]] = order[start:start + counts[b]]
    projections = torch.randn(blocks, block_size, 2 * c * d, generator=g).to(dtype)
    entries = torch.full((blocks, -(-block_size // ratio), d), float("nan"), dtype=dtype)
    return Cache(projections.to(DEVICE), entries.to(DEVICE), tables.to(DEVICE))


def weights(ratio: int, c: int, d: int, dtype: torch.dtype, g: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """position bias [ratio, c d] fp32, norm weight [d], YaRN frequencies of 8 rope dims."""
    freqs = rope_frequencies(8, 160000.0, yarn_factor=16, original_max_positions=65536)
    return (torch.randn(ratio, c * d, generator=g).to(DEVICE),
            (1 + 0.5 * torch.randn(d, generator=g)).to(dtype).to(DEVICE), freqs.to(DEVICE))


def step(seq_lens: list[int], new: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A step's seq_lens [B] and query_start_loc [B + 1] (int32, on DEVICE), max_query_len."""
    starts = torch.tensor([0, *new]).cumsum(0).to(torch.int32)
    return (torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE), starts.to(DEVICE),
            max(new))


# (ratio, overlap, block_size, the step's context lengths, its new tokens per request)
CASES = {
    "r4-overlap-bs4-mixed": (4, True, 4, [37, 5, 130, 8], [37, 1, 9, 8]),
    "r4-overlap-bs6-straddle": (4, True, 6, [23, 16, 9], [23, 3, 1]),
    "r4-plain-bs16": (4, False, 16, [37, 12, 7], [5, 12, 1]),
    "r8-plain-bs4-straddle": (8, False, 4, [40, 17, 16], [40, 9, 1]),
    "r8-overlap-bs4": (8, True, 4, [33, 16], [17, 1]),
    "r128-plain-bs64": (128, False, 64, [260, 128, 127], [133, 1, 1]),
}
D = {4: 24, 8: 16, 128: 16}  # small head dims (the interpreter is slow), all even


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_pool_matches_reference(case: str, dtype: torch.dtype) -> None:
    ratio, overlap, block_size, lens, new = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    c, d = (2 if overlap else 1), D[ratio]
    cache = make_cache(lens, block_size, ratio, c, d, dtype, g)
    bias, norm, freqs = weights(ratio, c, d, dtype, g)
    args = dict(ratio=ratio, overlap=overlap, norm_eps=EPS)
    got, want = cache.entries.clone(), cache.entries.clone()
    tables = (cache.tables, cache.tables)  # projections and entries through one table
    compress_pool_triton(cache.projections, got, bias, norm, freqs, *tables, *step(lens, new),
                         **args)
    compress_pool_ref(cache.projections, want, bias, norm, freqs, *tables, *step(lens, new),
                      **args)
    written = ~got.isnan().any(-1)
    assert torch.equal(written, ~want.isnan().any(-1))  # the same rows, and no others
    expected = sum(n // ratio - (n - q) // ratio for n, q in zip(lens, new, strict=True))
    assert int(written.sum()) == expected
    torch.testing.assert_close(got[written], want[written], **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("ratio", "overlap", "block_size"), [(4, True, 4), (8, False, 16)])
def test_a_decode_steps_store_and_pool_in_one_launch_as_in_two(ratio: int, overlap: bool,
                                                                block_size: int,
                                                                dtype: torch.dtype) -> None:
    """At a decode step each request's pooling program stores its token's row first: the
    same projections and entries, bit for bit, as `store_projections` then `compress_pool`
    (requests that close a window and ones that do not, one without a token, one whose slot
    is negative)."""
    g = torch.Generator().manual_seed(ratio + block_size)
    c, d = (2 if overlap else 1), D[ratio]
    lens = [4 * ratio, 3 * ratio - 1, 2 * ratio, 5, ratio]  # the 4th: no token this step
    cache = make_cache(lens, block_size, ratio, c, d, dtype, g)
    bias, norm, freqs = weights(ratio, c, d, dtype, g)
    new = [1, 1, 1, 0, 1]
    seq_lens, qsl, _ = step(lens, new)
    rows = [b for b, n in enumerate(new) if n]
    kv = torch.randn(len(rows), c * d, generator=g).to(dtype).to(DEVICE)
    gate = torch.randn(len(rows), c * d, generator=g).to(dtype).to(DEVICE)
    tables = cache.tables.cpu()
    slots = torch.tensor([int(tables[b, (lens[b] - 1) // block_size]) * block_size
                          + (lens[b] - 1) % block_size for b in rows])
    slots[-1] = -1  # a token that writes nowhere
    slots = slots.to(DEVICE)
    args = dict(ratio=ratio, overlap=overlap, norm_eps=EPS)
    two = (cache.projections.clone(), cache.entries.clone())
    store_projections_triton(kv, gate, two[0].flatten(0, 1), slots)
    compress_pool_triton(*two, bias, norm, freqs, cache.tables, cache.tables, seq_lens, qsl, 1,
                         **args)
    one = (cache.projections.clone(), cache.entries.clone())
    store_and_pool_triton(kv, gate, slots, *one, bias, norm, freqs, cache.tables, cache.tables,
                          seq_lens, qsl, 1, **args)
    assert torch.equal(one[0], two[0])
    assert torch.equal(one[1].isnan(), two[1].isnan())
    assert torch.equal(one[1].nan_to_num(), two[1].nan_to_num())
    assert int((~one[1].isnan().any(-1)).sum()) == 3  # the 1st, 3rd and 5th close one
    want = (cache.projections.clone(), cache.entries.clone())
    store_and_pool_ref(kv, gate, slots, *want, bias, norm, freqs, cache.tables, cache.tables,
                       seq_lens, qsl, 1, **args)
    assert torch.equal(one[0], want[0])
    written = ~want[1].isnan().any(-1)
    torch.testing.assert_close(one[1][written], want[1][written], **TOL[dtype])


@pytest.mark.parametrize(("ratio", "overlap", "block_size"),
                         [(4, True, 6), (8, False, 4), (4, False, 8)])
def test_served_sequence_gives_the_whole_sequences_entries(ratio: int, overlap: bool,
                                                           block_size: int) -> None:
    """A 13-token prefill then single-token decode steps up to 43 tokens, pooled step by step,
    give compress_kv_ref's entries of the 43 tokens, in entry order through the table."""
    g = torch.Generator().manual_seed(ratio)
    c, d, total = (2 if overlap else 1), 24, 43
    cache = make_cache([total], block_size, ratio, c, d, torch.float32, g)
    bias, norm, freqs = weights(ratio, c, d, torch.float32, g)
    tables = (cache.tables, cache.tables)
    compress_pool_triton(cache.projections, cache.entries, bias, norm, freqs, *tables,
                         *step([13], [13]), ratio=ratio, overlap=overlap, norm_eps=EPS)
    for seen in range(14, total + 1):
        compress_pool_triton(cache.projections, cache.entries, bias, norm, freqs, *tables,
                             *step([seen], [1]), ratio=ratio, overlap=overlap, norm_eps=EPS)
    table = cache.tables[0].long()
    pos = torch.arange(total, device=DEVICE)
    kv, gate = cache.projections.flatten(0, 1)[table[pos // block_size] * block_size
                                               + pos % block_size].chunk(2, dim=-1)
    whole = compress_kv_ref(kv, gate, bias, norm, freqs, ratio=ratio, overlap=overlap,
                            norm_eps=EPS)
    last = (torch.arange(total // ratio, device=DEVICE) + 1) * ratio - 1
    rows = table[last // block_size] * cache.entries.shape[1] + (last % block_size) // ratio
    torch.testing.assert_close(cache.entries.flatten(0, 1)[rows], whole,
                               **TOL[torch.float32])


def window_pool(cache: Cache, lens: list[int], new: list[int], horizon: int,
                g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The projections as a window KV group keeps them: a pool of their own, through their own
    tables, holding only the blocks of positions >= first - horizon (first: each request's
    first new token); the others are the padding block 0, NaN, so a read of one shows."""
    block_size = cache.projections.shape[1]
    keep = [n - q - horizon for n, q in zip(lens, new, strict=True)]
    wanted = [(b, i) for b, n in enumerate(lens) for i in range(-(-n // block_size))
              if (i + 1) * block_size - 1 >= keep[b]]
    ids = (torch.randperm(len(wanted), generator=g) + 1).tolist()
    pool = torch.full((len(wanted) + 1, *cache.projections.shape[1:]), float("nan"),
                      dtype=cache.projections.dtype, device=DEVICE)
    tables = torch.zeros_like(cache.tables)
    for (b, i), block in zip(wanted, ids, strict=True):
        tables[b, i] = block
        pool[block] = cache.projections[cache.tables[b, i]]
    return pool, tables


@pytest.mark.parametrize("pool", ["triton", "ref"])
@pytest.mark.parametrize(("ratio", "overlap", "block_size"),
                         [(4, True, 4), (4, True, 6), (4, True, 5), (8, False, 3),
                          (4, False, 16)])
def test_projections_in_a_window_group_give_the_same_entries(ratio: int, overlap: bool,
                                                             block_size: int,
                                                             pool: str) -> None:
    """The projections in a window group's pool and table (horizon 2 ratio - 1 with overlap,
    ratio - 1 without), the entries in the full group's: the entries equal the one-table
    case's, in the same rows, and nothing before the horizon is read. The horizon is tight:
    at block sizes 5 and 3, a request's first new token 11 (ratio 4, overlap) or 15 (ratio 8)
    closes a window whose first slot, horizon before it, is a block's last position."""
    g = torch.Generator().manual_seed(block_size + ratio)
    c, d = (2 if overlap else 1), 24
    lens, new = [37, 21, 130, 9, 20, 22], [9, 1, 5, 9, 9, 7]
    cache = make_cache(lens, block_size, ratio, c, d, torch.float32, g)
    bias, norm, freqs = weights(ratio, c, d, torch.float32, g)
    args = dict(ratio=ratio, overlap=overlap, norm_eps=EPS)
    want = cache.entries.clone()
    compress_pool_ref(cache.projections, want, bias, norm, freqs, cache.tables, cache.tables,
                      *step(lens, new), **args)
    projections, tables = window_pool(cache, lens, new, c * ratio - 1, g)
    got = cache.entries.clone()
    run = compress_pool_triton if pool == "triton" else compress_pool_ref
    run(projections, got, bias, norm, freqs, tables, cache.tables, *step(lens, new), **args)
    written = ~want.isnan().any(-1)
    assert int(written.sum()) > 0
    assert torch.equal(~got.isnan().any(-1), written)
    torch.testing.assert_close(got[written], want[written], **TOL[torch.float32])


@pytest.mark.parametrize("pool", ["triton", "ref"])
@pytest.mark.parametrize(("ratio", "overlap", "block_size"),
                         [(8, False, 4), (8, False, 3), (16, True, 6), (4, False, 16)])
def test_entries_in_a_periodic_group_land_in_the_blocks_it_holds(ratio: int, overlap: bool,
                                                                 block_size: int,
                                                                 pool: str) -> None:
    """The entries in a periodic full group of period `ratio` (`KVGroupSpec.period`): a pool
    of only the blocks holding a position k * ratio - 1, the table's other positions the
    padding block 0 (NaN, never written): each entry is the one-table case's, in the block at
    its last token's position."""
    g = torch.Generator().manual_seed(block_size + ratio)
    c, d = (2 if overlap else 1), 16
    lens, new = [37, 21, 70, 9], [9, 1, 5, 9]
    cache = make_cache(lens, block_size, ratio, c, d, torch.float32, g)
    bias, norm, freqs = weights(ratio, c, d, torch.float32, g)
    args = dict(ratio=ratio, overlap=overlap, norm_eps=EPS)
    want = cache.entries.clone()
    compress_pool_ref(cache.projections, want, bias, norm, freqs, cache.tables, cache.tables,
                      *step(lens, new), **args)
    spec = KVGroupSpec("p", period=ratio)
    held = [(b, i) for b, n in enumerate(lens) for i in range(-(-n // block_size))
            if spec.holds_block(i, block_size)]
    tables = torch.zeros_like(cache.tables)
    for block, (b, i) in enumerate(held, 1):
        tables[b, i] = block
    got = torch.full((len(held) + 1, *want.shape[1:]), float("nan"), device=DEVICE)
    run = compress_pool_triton if pool == "triton" else compress_pool_ref
    run(cache.projections, got, bias, norm, freqs, cache.tables, tables, *step(lens, new),
        **args)
    assert got[0].isnan().all()
    rows = torch.tensor([int(cache.tables[b, i]) for b, i in held])
    assert torch.equal(got[1:].isnan(), want[rows].isnan())
    assert int((~got[1:].isnan()).sum()) > 0
    torch.testing.assert_close(got[1:].nan_to_num(), want[rows].nan_to_num(),
                               **TOL[torch.float32])


def test_bad_shapes_are_refused() -> None:
    g = torch.Generator().manual_seed(0)
    cache = make_cache([8], 4, 4, 2, 24, torch.float32, g)
    bias, norm, freqs = weights(4, 2, 24, torch.float32, g)
    with pytest.raises(ValueError, match="position_bias"):
        compress_pool_triton(cache.projections, cache.entries, bias[:, :24], norm, freqs,
                             cache.tables, cache.tables, *step([8], [8]), ratio=4, overlap=True,
                             norm_eps=EPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("width", [24, 700], ids=["w24", "w700-two-tiles"])
def test_store_projections_writes_kv_then_gate_into_the_slots(dtype: torch.dtype,
                                                              width: int) -> None:
    """kv | gate into rows `slots` of the pool, exactly (a copy); a negative slot and every
    row not named stay as they were. kv is a strided view, as a matmul's slice may be."""
    g = torch.Generator().manual_seed(5)
    kv = torch.randn(5, 2 * width, generator=g).to(dtype)[:, :width]
    gate = torch.randn(5, width, generator=g).to(dtype)
    slots = torch.tensor([6, 0, -1, 11, 3])
    pool = torch.randn(12, 2 * width, generator=g).to(dtype)
    expected = pool.clone()
    store_projections_ref(kv, gate, expected, slots)
    assert torch.equal(expected[11], torch.cat([kv[3], gate[3]]))
    got = pool.to(DEVICE)
    store_projections_triton(kv.to(DEVICE), gate.to(DEVICE), got, slots.to(DEVICE))
    assert torch.equal(got.cpu(), expected)
    assert torch.equal(got.cpu()[[1, 2, 4, 5, 7, 8, 9, 10]], pool[[1, 2, 4, 5, 7, 8, 9, 10]])


def test_store_projections_op_runs_the_reference_on_cpu() -> None:
    kv, gate = torch.ones(2, 4), torch.full((2, 4), 2.0)
    pool, expected = torch.zeros(3, 8), torch.zeros(3, 8)
    store_projections(kv, gate, pool, torch.tensor([2, 0]))
    expected[2, :4], expected[2, 4:], expected[0, :4], expected[0, 4:] = 1, 2, 1, 2
    assert torch.equal(pool, expected)


@pytest.mark.gpu
@pytest.mark.parametrize(("ratio", "overlap", "d"), [(4, True, 512), (4, True, 128),
                                                     (128, False, 512)])
def test_v4_flash_decode_and_prefill(ratio: int, overlap: bool, d: int) -> None:
    """V4-Flash widths (main 512, indexer 128; 64 rope dims), block size 64, bf16: a decode
    step of 64 requests at varied lengths and a batch of long prefill chunks."""
    g = torch.Generator().manual_seed(d)
    c = 2 if overlap else 1
    lens = torch.randint(ratio, 3000, (64,), generator=g).tolist()
    for new in ([1] * 64, [min(n, 300) for n in lens]):
        cache = make_cache(lens, 64, ratio, c, d, torch.bfloat16, g)
        bias = torch.randn(ratio, c * d, generator=g).to(DEVICE)
        norm = (1 + 0.5 * torch.randn(d, generator=g)).bfloat16().to(DEVICE)
        freqs = rope_frequencies(64, 160000.0, yarn_factor=16,
                                 original_max_positions=65536).to(DEVICE)
        args = dict(ratio=ratio, overlap=overlap, norm_eps=EPS)
        got, want = cache.entries.clone(), cache.entries.clone()
        tables = (cache.tables, cache.tables)
        compress_pool_triton(cache.projections, got, bias, norm, freqs, *tables,
                             *step(lens, new), **args)
        compress_pool_ref(cache.projections, want, bias, norm, freqs, *tables,
                          *step(lens, new), **args)
        written = ~got.isnan().any(-1)
        assert torch.equal(written, ~want.isnan().any(-1))
        torch.testing.assert_close(got[written], want[written], **TOL[torch.bfloat16])
