"""The router kernel (`kernels/router`) against the references it replaces: biased top-k and
hash routing over odd expert counts, bf16 and fp32 logits, large logits (softplus's linear
branch), very negative ones (log1p of a tiny exp), ties (to the earlier expert) and no tokens."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.router import route_hash_ref, route_topk_ref
from openinfer_deepseek_v4.kernels.router.triton import route_hash_triton, route_topk_triton

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
