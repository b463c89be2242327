"""`stable_topk` is a stable descending sort's first k columns, and the top-k / top-p filter that
selects those columns drops exactly what the filter over the whole sorted row drops."""

from __future__ import annotations

import pytest
import torch

from openinfer_core.params import SamplingParams
from openinfer_core.sampling import sampler as sampler_module
from openinfer_core.sampling import stable_topk as stable_topk_module
from openinfer_core.sampling.sampler import _top_k_top_p_sorted, apply_top_k_top_p
from openinfer_core.sampling.stable_topk import stable_topk


@pytest.fixture(autouse=True)
def _always_select(monkeypatch: pytest.MonkeyPatch) -> None:
    """The select path at every batch size (below SELECT_MIN_ROWS rows it would sort)."""
    monkeypatch.setattr(stable_topk_module, "SELECT_MIN_ROWS", 1)


def _tied_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Few distinct values (many ties), signed zeros and -inf."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-6, 6, (rows, vocab), generator=g).float() * 0.75
    x[0, :7] = float("-inf")
    x[1, 3], x[1, 4] = -0.0, 0.0
    x[-1] = float("-inf")
    return x


@pytest.mark.parametrize("rows", [3, 300])
def test_stable_topk_is_the_stable_sort_prefix(rows: int) -> None:
    x = _tied_logits(rows, 257, seed=rows)
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
    for k in (0, 1, 5, 64, 257):
        values, ids = stable_topk(x, k)
        assert torch.equal(ids, order[:, :k]) and torch.equal(values, sorted_x[:, :k])


def test_stable_topk_keeps_the_lowest_ids_of_a_tie_at_the_kth_value() -> None:
    x = torch.tensor([[1.0, 2.0, 1.0, 1.0, 3.0, 1.0, 1.0, 0.0]]).repeat(3, 1)
    x[1] = x[1].flip(0)
    x[2, 1] = 1.0  # seven ids at 1.0
    for k in range(1, 9):
        values, ids = stable_topk(x, k)
        sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
        assert torch.equal(ids, order[:, :k]) and torch.equal(values, sorted_x[:, :k]), k


def test_stable_topk_orders_extreme_values() -> None:
    x = torch.tensor([[3.0e38, -3.0e38, 1e-45, -1e-45, float("inf"), 0.0, -1.0, 1.0]])
    values, ids = stable_topk(x, 8)
    assert ids.tolist() == [[4, 0, 7, 2, 5, 3, 6, 1]]
    assert torch.equal(values, x[:, ids[0]])


def test_stable_topk_rejects_what_it_cannot_order() -> None:
    with pytest.raises(ValueError, match="fp32"):
        stable_topk(torch.zeros(2, 4, dtype=torch.float64), 1)
    with pytest.raises(ValueError, match="k must be"):
        stable_topk(torch.zeros(2, 4), 5)
    values, ids = stable_topk(torch.zeros(0, 4), 2)
    assert values.shape == ids.shape == (0, 2)


def test_selected_filter_drops_what_the_sorted_filter_drops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "TOP_K_SELECT_MAX", 40)
    g = torch.Generator().manual_seed(11)
    x = torch.cat([_tied_logits(6, 300, seed=3), torch.randn(6, 300, generator=g) * 3])
    params = [SamplingParams(temperature=1.0, top_k=k, top_p=p)
              for k, p in [(2, 1.0), (5, 0.9), (40, 0.5), (13, 1.0), (-1, 0.8), (100, 0.95)] * 2]
    ks = [min(p.top_k, 300) if p.top_k_enabled else 300 for p in params]
    expected = _top_k_top_p_sorted(x, ks, params)
    got = apply_top_k_top_p(x, params)  # rows of k <= 40 selected, the others sorted
    assert torch.equal(got.isinf(), expected.isinf())
    assert torch.equal(got, expected)
    kept = (~got.isinf()).sum(dim=-1)
    assert kept[0] == 2 and kept[3] == 13 and (kept[:4] <= torch.tensor([2, 5, 40, 13])).all()


def test_stable_topk_puts_nan_first_as_the_sort_does() -> None:
    """A NaN logit (a broken model) must not break the select: it comes first, as in the sort;
    which of several NaNs comes first is not kept (NaN is not ordered)."""
    x = _tied_logits(4, 50, seed=9)
    x[0, 3] = float("nan")
    x[2, [5, 40]] = float("nan")
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
    one_nan = [0, 1, 3]
    for k in (1, 2, 3, 20):
        values, ids = stable_topk(x, k)
        assert torch.equal(ids[one_nan], order[one_nan, :k]), k
        assert torch.equal(values.isnan(), sorted_x[:, :k].isnan())
        assert sorted(ids[2, :2].tolist()) == ([5, 40] if k >= 2 else ids[2, :1].tolist())


def test_the_filter_takes_an_empty_batch_and_a_vanishing_top_p() -> None:
    assert apply_top_k_top_p(torch.zeros(0, 7), []).shape == (0, 7)
    x = torch.tensor([[0.5, 2.0, 1.0, 2.0]])
    out = apply_top_k_top_p(x, [SamplingParams(temperature=1.0, top_p=1e-50)])
    assert (~out.isinf()).nonzero().tolist() == [[0, 1]]  # the top id alone, not nothing
