"""The router kernel (`kernels/router`) against the references it replaces: biased top-k and
hash routing over odd expert counts, bf16 and fp32 logits, large logits (softplus's linear
branch), very negative ones (log1p of a tiny exp), ties (to the earlier expert) and no tokens;
and the fused router (the product and the routing in one launch) against the two launches."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.router import route_hash_ref, route_topk_ref
from openinfer_deepseek_v4.kernels.router.fused import route_fused_triton
from openinfer_deepseek_v4.kernels.router.triton import route_hash_triton, route_topk_triton
from openinfer_kernels.gemm.triton import Tile, linear_triton
from openinfer_kernels.split_k import split_counters

# The kernels run compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALE = 1.5
# fp32 weights from the same math: exp, log and the k-term sum in another order, a few ulps.
WEIGHTS_TOL = dict(rtol=1e-5, atol=1e-7)


def logits_of(t: int, e: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[T, E] logits spread over softplus's branches: some above 20, some far below 0."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=g) * 4
    logits[:, 0] = 25.0 + torch.rand(t, generator=g)  # the linear branch
    logits[:, -1] = -30.0 - torch.rand(t, generator=g)  # exp underflows 1 + y
    return logits.to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "e", "k"), [(1, 8, 2), (3, 37, 6), (5, 256, 6), (2, 5, 5)])
def test_topk_matches_reference(t: int, e: int, k: int, dtype: torch.dtype) -> None:
    logits = logits_of(t, e, dtype, seed=t * 100 + e)
    bias = (torch.randn(e, generator=torch.Generator().manual_seed(e)) * 0.5).to(DEVICE)
    weights, ids = route_topk_triton(logits, bias, k, SCALE)
    want_w, want_ids = route_topk_ref(logits, bias, k, SCALE)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert ids.shape == weights.shape == (t, k)
    assert torch.equal(ids, want_ids)  # in the reference's order: descending biased score
    torch.testing.assert_close(weights, want_w, **WEIGHTS_TOL)
    torch.testing.assert_close(weights.sum(-1), torch.full((t,), SCALE, device=DEVICE))


def test_topk_ties_go_to_the_earlier_expert() -> None:
    # Experts 1, 3, 4 and 6 tie for the top; 0 and 5 tie below them; the bias breaks none.
    logits = torch.tensor([[0.5, 2.0, -1.0, 2.0, 2.0, 0.5, 2.0, -3.0]], device=DEVICE)
    bias = torch.zeros(8, device=DEVICE)
    weights, ids = route_topk_triton(logits, bias, 6, SCALE)
    assert ids.tolist() == [[1, 3, 4, 6, 0, 5]]
    want_w, _ = route_topk_ref(logits, bias, 6, SCALE)
    torch.testing.assert_close(weights.sort(-1).values, want_w.sort(-1).values, **WEIGHTS_TOL)
    # Equal scores and equal biases above the rest: a tie after the bias too.
    logits = torch.tensor([[3.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 0.0]], device=DEVICE)
    bias = torch.tensor([-5.0, 0.0, 0.25, 0.0, 0.0, 0.0, 0.25, 0.0], device=DEVICE)
    _, ids = route_topk_triton(logits, bias, 3, SCALE)
    assert ids.tolist() == [[2, 6, 4]]


@pytest.mark.parametrize("table_dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize(("t", "e", "k"), [(1, 8, 2), (4, 37, 6), (3, 256, 6)])
def test_hash_matches_reference(t: int, e: int, k: int, table_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(e + k)
    vocab = 50
    table = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(vocab)])
    table = table.to(table_dtype).to(DEVICE)
    token_ids = torch.randint(0, vocab, (t,), generator=g).to(DEVICE)
    logits = logits_of(t, e, torch.bfloat16, seed=e)
    weights, ids = route_hash_triton(logits, table, token_ids, SCALE)
    want_w, want_ids = route_hash_ref(logits, table, token_ids, SCALE)
    assert torch.equal(ids, want_ids) and ids.dtype == torch.int64
    torch.testing.assert_close(weights, want_w, **WEIGHTS_TOL)


def test_no_tokens() -> None:
    logits = torch.zeros((0, 8), device=DEVICE)
    weights, ids = route_topk_triton(logits, torch.zeros(8, device=DEVICE), 2, SCALE)
    assert weights.shape == ids.shape == (0, 2)


# The fused router (kernels/router/fused.py): K = 192 over a split-K tile of 16 columns.
FUSED_TILES = {"rows1-split3": Tile(16, 64, 3), "rows1-split2-k32": Tile(16, 32, 2)}


@pytest.mark.parametrize("tile", FUSED_TILES)
@pytest.mark.parametrize("hashed", [False, True], ids=["topk", "hash"])
@pytest.mark.parametrize(("t", "e"), [(1, 64), (3, 40), (16, 37)])
def test_fused_router_is_the_linear_then_the_router(t: int, e: int, hashed: bool,
                                                    tile: str) -> None:
    """The product and the routing in one launch give the small-batch linear's logits (its
    tile, shares summed in the same order) routed by the router kernel: the same ids and
    weights, bit for bit; every arrival count back at 0 (a graph's next replay starts there)."""
    g = torch.Generator().manual_seed(t * 10 + e)
    x = torch.randn(t, 192, generator=g).to(torch.bfloat16).to(DEVICE)
    gate = (0.3 * torch.randn(e, 192, generator=g)).to(torch.bfloat16).to(DEVICE)
    bias = (0.5 * torch.randn(e, generator=g)).to(DEVICE)
    table = torch.randint(0, e, (50, 6), generator=g).to(DEVICE)
    tokens = torch.randint(0, 50, (t,), generator=g).to(DEVICE)
    logits = linear_triton(x, gate, FUSED_TILES[tile])
    if hashed:
        want = route_hash_triton(logits, table, tokens, SCALE)
        got = route_fused_triton(x, gate, FUSED_TILES[tile], None, table, tokens, 6, SCALE)
    else:
        want = route_topk_triton(logits, bias, 6, SCALE)
        got = route_fused_triton(x, gate, FUSED_TILES[tile], bias, None, None, 6, SCALE)
    assert got is not None
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert not split_counters(x.device).any()


def test_fused_router_declines_what_it_does_not_take() -> None:
    x = torch.zeros(17, 64, dtype=torch.bfloat16, device=DEVICE)
    gate = torch.zeros(8, 64, dtype=torch.bfloat16, device=DEVICE)
    bias = torch.zeros(8, device=DEVICE)
    assert route_fused_triton(x, gate, Tile(16, 32, 2), bias, None, None, 2, SCALE) is None
    assert route_fused_triton(x[:2], gate, Tile(16, 32, 1), bias, None, None, 2, SCALE) is None
