"""top_p_sample: the race within each row's top-p nucleus, found by pivots rather than a sort,
picks the very token race_sample picks on the row with everything outside the nucleus at -inf
(the same Philox noise). Rows with ties, -inf ids, one all -inf, nuclei of one id and of all."""

from __future__ import annotations

import pytest
import torch

from openinfer_kernels.sampling import SAMPLING_KERNELS, top_p_sample, top_p_sample_ref
from openinfer_kernels.sampling.reference import race_sample_ref, top_p_nucleus
from openinfer_kernels.sampling.top_p import top_p_sample_triton
from openinfer_kernels.sampling.triton import race_sample_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Interpreted (no GPU), small rows and tiles keep it quick; compiled, Qwen3's vocabulary.
VOCAB, BLOCK = (300, 64) if DEVICE == "cpu" else (151936, 2048)


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, VOCAB, generator=g) * torch.linspace(0.3, 6.0, n).unsqueeze(1)
    x[1, : VOCAB // 3] = float("-inf")
    x[2] = float("-inf")
    x[3] = torch.randint(-3, 3, (VOCAB,), generator=g).float()  # many ties
    x[4, 7] = 60.0  # one id holds all the mass
    top_p = torch.rand(n, generator=g) * 0.98 + 0.01
    top_p[5] = 1e-6
    top_p[6] = 0.999999
    seeds = torch.randint(-2**62, 2**62, (n,), generator=g)
    return x.to(DEVICE), top_p.to(DEVICE), seeds.to(DEVICE)


def test_the_nucleus_is_the_smallest_prefix_reaching_top_p() -> None:
    x = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.2, 0.1]]))

    def kept(p: float) -> torch.Tensor:
        return (~top_p_nucleus(x, torch.tensor([p])).isinf())[0].nonzero().flatten()

    assert kept(0.3).tolist() == [1]
    assert kept(0.5).tolist() == [1, 2]  # of the tied 0.2s, the lower id first
    assert kept(0.55).tolist() == [1, 2]
    assert kept(0.65).tolist() == [1, 2, 3]
    assert kept(1.0).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_picks_the_race_winner_within_the_nucleus(seed: int) -> None:
    x, top_p, seeds = _rows(16, seed)
    got = top_p_sample_triton(x, top_p, seeds, block=BLOCK)
    ones = torch.ones(x.shape[0], device=DEVICE)
    want = race_sample_triton(top_p_nucleus(x, top_p), ones, None, seeds, block=BLOCK)
    assert got.tolist() == want.tolist()
    assert got[2] == 0 and got[4] == 7  # all -inf: id 0, as the race; a certain id
    assert got[5] == int(x[5].argmax())  # a nucleus of the top id alone


def test_reference_is_the_reference_race_within_the_nucleus() -> None:
    x, top_p, seeds = (t.cpu() for t in _rows(8, 2))
    ones = torch.ones(8)
    got = top_p_sample_ref(x, top_p, seeds)
    assert got.tolist() == race_sample_ref(top_p_nucleus(x, top_p), ones, None, seeds).tolist()
    assert top_p_sample(x, top_p, seeds).tolist() == got.tolist()  # CPU: the reference


def test_sampling_kernels_offer_top_p_sample() -> None:
    x, top_p, seeds = _rows(8, 3)
    got = SAMPLING_KERNELS.top_p_sample(x, top_p, seeds)
    assert got.shape == (8,) and got.dtype == torch.int64
    empty = top_p_sample_triton(x[:0], top_p[:0], seeds[:0], block=BLOCK)
    assert empty.shape == (0,)


def test_a_top_p_that_rounds_to_zero_keeps_the_top_id() -> None:
    """fp32 holds no top_p below ~1e-45: at 0 the search must still end, on the top id."""
    x, _, seeds = _rows(8, 4)
    top_p = torch.tensor([0.0, 1e-45] * 4, device=DEVICE)
    got = top_p_sample_triton(x, top_p, seeds, block=BLOCK)
    best = x.argmax(dim=-1)
    best[2] = 0  # the all -inf row
    assert got.tolist() == best.tolist()
