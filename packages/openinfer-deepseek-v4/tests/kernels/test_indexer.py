"""The lightning indexer's kernels against their references: scores (to a tolerance), the
ordered causal top-k (exactly: ties to the earlier entry, -0.0 = 0.0), and the paged form
(exactly, on integer-valued inputs whose scores every summation order gets right). At
DeepSeek-V4-Flash's shapes on a GPU (-m gpu)."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.indexer import (
    indexer_scores_ref,
    indexer_topk,
    indexer_topk_ordered_ref,
    indexer_topk_paged,
    indexer_topk_paged_ref,
    paged_entry_slots,
    token_requests,
)
from openinfer_deepseek_v4.kernels.indexer.topk_select_triton import launch_topk_select
from openinfer_deepseek_v4.kernels.indexer.topk_triton import launch_topk
from openinfer_deepseek_v4.kernels.indexer.triton import (
    _launch_scores,
    indexer_scores_triton,
    indexer_topk_paged_triton,
    indexer_topk_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# Products of fp32 (or bf16, exact in fp32) inputs summed in another order than the
# reference's einsum: a few fp32 ulps of the largest partial sum.
SCORE_TOLERANCE = dict(atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("entries_first", [False, True], ids=["heads-first", "entries-first"])
@pytest.mark.parametrize(("block_e", "warps"), [(16, 4), (128, 8)])
def test_scores_at_other_tiles(block_e: int, warps: int, entries_first: bool) -> None:
    """The launch knobs the bench sweeps (`_launch_scores`'s: entries a tile, warps, the
    product's orientation): 7 tokens in blocks of 4 over 150 entries, the last tile short."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(7, 8, 64, generator=g).to(DEVICE)
    keys = torch.randn(150, 64, generator=g).to(DEVICE)
    weights = torch.randn(7, 8, generator=g).to(DEVICE)
    out = torch.empty(7, 150, dtype=torch.float32, device=DEVICE)
    _launch_scores(q, weights, keys, out, 0.125, {}, tokens=4, block_e=block_e, warps=warps,
                   entries_first=entries_first)
    torch.testing.assert_close(out, indexer_scores_ref(q, keys, weights, softmax_scale=0.125,
                                                       weights_scale=1.0), **SCORE_TOLERANCE)


@pytest.mark.parametrize("per_program", [None, 4], ids=["default", "blocks-of-4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens,heads,dim,entries", [(1, 3, 40, 70), (5, 8, 64, 9),
                                                      (7, 5, 48, 33), (2, 4, 40, 0)])
def test_scores_match_reference(tokens: int, heads: int, dim: int, entries: int,
                                dtype: torch.dtype, per_program: int | None) -> None:
    """Every token a program (the default at these sizes), or blocks of 4 tokens sharing each
    key tile (a prompt's), the last block short."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(tokens, heads, dim, generator=g).to(dtype).to(DEVICE)
    keys = torch.randn(entries, dim, generator=g).to(dtype).to(DEVICE)
    weights = torch.randn(tokens, heads, generator=g).to(DEVICE)
    scales = dict(softmax_scale=dim ** -0.5, weights_scale=heads ** -0.5)
    out = indexer_scores_triton(q, keys, weights, **scales, tokens=per_program)
    assert out.dtype == torch.float32 and out.shape == (tokens, entries)
    torch.testing.assert_close(out, indexer_scores_ref(q, keys, weights, **scales),
                               **SCORE_TOLERANCE)


def tied_scores(tokens: int, entries: int, seed: int) -> torch.Tensor:
    """Scores with many ties: a few integer levels, exact zeros of both signs."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-2, 4, (tokens, entries), generator=g).float()
    scores[scores == -2] = -0.0
    return scores.to(DEVICE)


@pytest.mark.parametrize("top_k", [1, 5, 16, 33, 100])
@pytest.mark.parametrize("entries", [9, 70])
def test_topk_is_ordered_and_causal(entries: int, top_k: int) -> None:
    """Positions from nothing visible (0) through part of the row to past its end; top_k
    above and below the visible count."""
    scores = tied_scores(6, entries, seed=entries + top_k)
    positions = torch.tensor([0, 3, 13, 42, 150, 400], device=DEVICE)
    out = indexer_topk_triton(scores, positions, ratio=4, top_k=top_k)
    assert out.dtype == torch.int64
    assert torch.equal(out, indexer_topk_ordered_ref(scores, positions, ratio=4, top_k=top_k))


def test_all_zero_scores_pick_the_earliest() -> None:
    scores = torch.zeros(2, 40, device=DEVICE)
    scores[1, ::2] = -0.0
    positions = torch.tensor([39, 21], device=DEVICE)
    out = indexer_topk_triton(scores, positions, ratio=1, top_k=30)
    assert out[0].tolist() == list(range(30))
    assert out[1].tolist() == list(range(22)) + [-1] * 8


def test_topk_of_distinct_scores() -> None:
    scores = torch.randn(4, 300, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    positions = torch.tensor([1199, 20, 700, 3], device=DEVICE)
    out = indexer_topk_triton(scores, positions, ratio=4, top_k=64)
    assert torch.equal(out, indexer_topk_ordered_ref(scores, positions, ratio=4, top_k=64))


BLOCK_SIZE, RATIO = 16, 4
SLOTS_PER_BLOCK = BLOCK_SIZE // RATIO


def paged_step(heads: int, dim: int, dtype: torch.dtype,
               seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A step of 4 requests on a 24-block pool: a decode at 50, a 3-token chunk ending at 70,
    a request with no token this step, a 2-token prefill from 7; then one graph-padding token
    at position 0. Integer-valued q, keys and weights: every score is exact."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randint(-2, 3, (24, SLOTS_PER_BLOCK, dim), generator=g).to(dtype)
    tables = torch.zeros(4, 6, dtype=torch.int32)
    blocks = (torch.randperm(23, generator=g) + 1).to(torch.int32)
    tables[0, :4], tables[1, :5], tables[2, :2], tables[3, :1] = (
        blocks[:4], blocks[4:9], blocks[9:11], blocks[11:12])
    positions = torch.tensor([49, 67, 68, 69, 7, 8, 0])
    q = torch.randint(-2, 3, (7, heads, dim), generator=g).to(dtype)
    weights = torch.randint(-2, 3, (7, heads), generator=g).float()
    step = dict(q=q, weights=weights, index_pool=pool, block_tables=tables,
                query_start_loc=torch.tensor([0, 1, 4, 4, 6], dtype=torch.int32),
                positions=positions)
    return {k: v.to(DEVICE) for k, v in step.items()}, pool


@pytest.mark.parametrize("as_slots", [False, True], ids=["entries", "slots"])
@pytest.mark.parametrize("top_k", [3, 8, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_paged_matches_reference(dtype: torch.dtype, top_k: int, as_slots: bool) -> None:
    step, _ = paged_step(5, 40, dtype, seed=top_k)
    options = dict(ratio=RATIO, block_size=BLOCK_SIZE, top_k=top_k, softmax_scale=0.25,
                   weights_scale=0.5, as_slots=as_slots)
    out = indexer_topk_paged_triton(**step, **options)
    assert out.dtype == torch.int32 and out.shape == (7, top_k)
    assert torch.equal(out, indexer_topk_paged_ref(**step, **options))
    assert (out[-1] == -1).all()  # padding at position 0 sees nothing


@pytest.mark.parametrize("per_program", [2, 4, 8])
def test_token_blocks_pick_the_same(per_program: int) -> None:
    """Blocks of tokens sharing a key tile, as a prompt's do: here the blocks straddle the
    step's four requests (a token of another request than its block's first reads its own
    keys) and the graph padding, and each token still sees only its own entries."""
    step, _ = paged_step(5, 40, torch.bfloat16, seed=per_program)
    options = dict(ratio=RATIO, block_size=BLOCK_SIZE, top_k=8, softmax_scale=0.25,
                   weights_scale=0.5, as_slots=True)
    out = indexer_topk_paged_triton(**step, **options, tokens=per_program)
    assert torch.equal(out, indexer_topk_paged_ref(**step, **options))


def test_paged_max_entries_bounds_the_scan() -> None:
    step, _ = paged_step(3, 40, torch.float32, seed=9)
    options = dict(ratio=RATIO, block_size=BLOCK_SIZE, top_k=20, softmax_scale=1.0,
                   weights_scale=1.0, max_entries=10)
    out = indexer_topk_paged_triton(**step, **options)
    assert int(out.max()) < 10
    assert torch.equal(out, indexer_topk_paged_ref(**step, **options))


def test_paged_takes_the_callers_requests() -> None:
    """A step's token -> request map made once (the model shares it across layers) gives the
    picks the op would find itself."""
    step, _ = paged_step(5, 40, torch.float32, seed=4)
    options = dict(ratio=RATIO, block_size=BLOCK_SIZE, top_k=8, softmax_scale=0.25,
                   weights_scale=0.5, as_slots=True)
    requests = token_requests(step["query_start_loc"], step["q"].shape[0])
    want = indexer_topk_paged_ref(**step, **options)
    assert torch.equal(indexer_topk_paged_ref(**step, **options, requests=requests), want)
    assert torch.equal(indexer_topk_paged_triton(**step, **options, requests=requests), want)


def test_entry_slots_follow_the_block_of_the_last_token() -> None:
    """Entry j sits in the block of token 4j + 3, at slot (4j + 3) % 16 // 4."""
    tables = torch.tensor([[5, 9, 2]], dtype=torch.int32)
    entries = torch.tensor([[0, 3, 4, 7, 11, -1]])
    slots = paged_entry_slots(tables, torch.tensor([0]), entries, ratio=4, block_size=16,
                              slots_per_block=4)
    assert slots.tolist() == [[20, 23, 36, 39, 11, -1]]


def test_ops_run_the_references_on_cpu() -> None:
    scores = tied_scores(3, 20, seed=1).cpu()
    positions = torch.tensor([5, 40, 79])
    assert torch.equal(indexer_topk(scores, positions, ratio=4, top_k=8),
                       indexer_topk_ordered_ref(scores, positions, ratio=4, top_k=8))
    step, _ = paged_step(3, 40, torch.float32, seed=2)
    step = {k: v.cpu() for k, v in step.items()}
    options = dict(ratio=RATIO, block_size=BLOCK_SIZE, top_k=8, softmax_scale=1.0,
                   weights_scale=1.0)
    assert torch.equal(indexer_topk_paged(**step, **options),
                       indexer_topk_paged_ref(**step, **options))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64])
def test_v4_flash_shapes(tokens: int) -> None:
    """64 heads x 128 dims over 16k entries (a 64k context), top 512, integer-valued so the
    picks are exact; each token its own request."""
    g = torch.Generator().manual_seed(4)
    entries, block_size, ratio = 16384, 64, 4
    blocks_per_request = entries * ratio // block_size
    pool = torch.randint(-2, 3, (tokens * blocks_per_request + 1, block_size // ratio, 128),
                         generator=g).to(torch.bfloat16).cuda()
    tables = (1 + torch.randperm(tokens * blocks_per_request, generator=g)).view(
        tokens, blocks_per_request).to(torch.int32).cuda()
    q = torch.randint(-2, 3, (tokens, 64, 128), generator=g).to(torch.bfloat16).cuda()
    weights = torch.randint(-2, 3, (tokens, 64), generator=g).float().cuda()
    positions = (entries * ratio - 1 - torch.arange(tokens) * 997).cuda()
    step = dict(q=q, weights=weights, index_pool=pool, block_tables=tables,
                query_start_loc=torch.arange(tokens + 1, dtype=torch.int32).cuda(),
                positions=positions)
    options = dict(ratio=ratio, block_size=block_size, top_k=512, softmax_scale=2.0 ** -4,
                   weights_scale=2.0 ** -3)
    out = indexer_topk_paged(**step, **options)
    assert torch.equal(out, indexer_topk_paged_ref(**step, **options))


def test_topk_at_v4_width_folds_many_chunks() -> None:
    """V4-Flash's top 512 (KP = 512: nine merge stages a fold) over rows of 2,600 tied scores
    (five full chunks and a part; the second row sees 1,250), in one piece and in three."""
    scores = tied_scores(2, 2600, seed=3)
    positions = torch.tensor([10399, 5000], device=DEVICE)
    want = indexer_topk_ordered_ref(scores, positions, ratio=4, top_k=512)
    for pieces in (1, 3):
        out = torch.empty(2, 512, dtype=torch.int64, device=DEVICE)
        launch_topk(scores, positions, out, 4, {}, pieces=pieces)
        assert torch.equal(out, want)


@pytest.mark.parametrize("pieces", [1, 2, 5, 16])
def test_any_piece_count_gives_the_same(pieces: int) -> None:
    """Rows cut into pieces, each piece's best list merged: empty pieces (past a query's
    visible entries, or past the row) must change nothing."""
    scores = tied_scores(4, 300, seed=pieces)
    positions = torch.tensor([1199, 20, 700, 3], device=DEVICE)
    out = torch.empty(4, 24, dtype=torch.int64, device=DEVICE)
    launch_topk(scores, positions, out, 4, {}, pieces=pieces)
    assert torch.equal(out, indexer_topk_ordered_ref(scores, positions, ratio=4, top_k=24))


@pytest.mark.parametrize("kind", ["tied", "spread"])
@pytest.mark.parametrize(("entries", "top_k"), [(9, 5), (70, 16), (70, 100), (3000, 33),
                                                (2600, 512)])
def test_radix_select_picks_as_the_reference(entries: int, top_k: int, kind: str) -> None:
    """The select's threshold and ties: rows of a few tied levels (both zeros among them), or
    of spread scores of mixed sign and scale; positions from nothing visible to past the row's
    end, and top_k above and below the visible count."""
    if kind == "tied":
        scores = tied_scores(6, entries, seed=entries + top_k)
    else:
        g = torch.Generator().manual_seed(entries * top_k)
        scores = (torch.randn(6, entries, generator=g)
                  * torch.logspace(-20, 20, 6)[:, None]).to(DEVICE)
    positions = torch.tensor([0, 3, 13, 42, 150, 4 * entries + 10], device=DEVICE)
    out = torch.empty(6, min(top_k, entries), dtype=torch.int64, device=DEVICE)
    launch_topk_select(scores, positions, out, 4, {})
    assert torch.equal(out, indexer_topk_ordered_ref(scores, positions, ratio=4, top_k=top_k))


def test_radix_select_gives_pool_rows_as_the_sort() -> None:
    """The paged form's picks as pool rows (`as_slots`), through each token's request's block
    table: the same as the sorting kernel's."""
    g = torch.Generator().manual_seed(5)
    scores = tied_scores(4, 300, seed=6)
    tables = (1 + torch.randperm(2 * 75, generator=g)).view(2, 75).to(torch.int32).to(DEVICE)
    paged = {"block_tables": tables, "requests": torch.tensor([0, 0, 1, 1], device=DEVICE),
             "as_slots": True, "block_size": 16, "slots_per_block": 4}
    positions = torch.tensor([1199, 20, 700, 3], device=DEVICE)
    want = torch.empty(4, 24, dtype=torch.int32, device=DEVICE)
    launch_topk(scores, positions, want, 4, paged)
    out = torch.empty_like(want)
    launch_topk_select(scores, positions, out, 4, paged)
    assert torch.equal(out, want)


@pytest.mark.parametrize("method", ["select", "sort"])
def test_prompt_steps_take_the_chosen_top_k(monkeypatch: pytest.MonkeyPatch,
                                            method: str) -> None:
    """OPENINFER_DSV4_TOPK (read at import: set here on the module; unset, select) sends a
    prompt step's top-k (past DECODE_TOKENS tokens) through the radix select or the sort,
    with the same picks."""
    import openinfer_deepseek_v4.kernels.indexer.triton as indexer_triton

    calls = []

    def counted(*args: object, **kwargs: object) -> None:
        calls.append(1)
        launch_topk_select(*args, **kwargs)  # type: ignore[arg-type]

    assert indexer_triton._TOPK == "select"  # the default
    monkeypatch.setattr(indexer_triton, "_TOPK", method)
    monkeypatch.setattr(indexer_triton, "launch_topk_select", counted)
    tokens = indexer_triton.DECODE_TOKENS + 4
    scores = tied_scores(tokens, 40, seed=9)
    positions = torch.arange(tokens, device=DEVICE) % 200
    out = indexer_topk_triton(scores, positions, ratio=4, top_k=8)
    assert calls == ([1] if method == "select" else [])
    assert torch.equal(out, indexer_topk_ordered_ref(scores, positions, ratio=4, top_k=8))
