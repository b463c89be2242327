"""embedding against a row-by-row Python lookup: it copies rows, so equality is exact."""

from __future__ import annotations

import pytest
import torch

import openinfer_kernels
from openinfer_kernels.embed import embedding_ref

VOCAB = 50

IDS = {
    "t1": [7],
    "first-and-last-row": [0, VOCAB - 1],
    "repeats-unsorted": [3, 3, 41, 0, 3, 17],
    "t63": [(i * 13) % VOCAB for i in range(63)],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hidden", [24, 60])
@pytest.mark.parametrize("case", list(IDS))
def test_embedding_copies_rows(case, hidden, dtype):
    weight = torch.randn(VOCAB, hidden, generator=torch.Generator().manual_seed(0)).to(dtype)
    ids = IDS[case]
    out = embedding_ref(torch.tensor(ids), weight)
    expected = torch.stack([weight[i] for i in ids])
    assert out.shape == (len(ids), hidden) and out.dtype == dtype
    assert torch.equal(out, expected)


def test_output_does_not_alias_the_weight():
    weight = torch.randn(VOCAB, 8)
    weight_before = weight.clone()
    out = embedding_ref(torch.tensor([1, 2]), weight)
    out.fill_(0)
    assert torch.equal(weight, weight_before)


@pytest.mark.parametrize("bad_id", [VOCAB, -1])
def test_out_of_range_id_raises(bad_id):
    with pytest.raises((IndexError, RuntimeError)):
        embedding_ref(torch.tensor([0, bad_id]), torch.randn(VOCAB, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_public_op_on_cpu_is_the_reference(dtype):
    weight = torch.randn(VOCAB, 60).to(dtype)
    ids = torch.tensor(IDS["t63"])
    assert torch.equal(openinfer_kernels.embedding(ids, weight), embedding_ref(ids, weight))


# The kernels run compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("hidden", [24, 1100])
def test_a_vocabulary_parts_lookup_is_its_rows_and_zeros(ids_dtype, hidden):
    """The kernel gives the reference's rows (zeros for ids outside the part), and the parts'
    lookups sum to the whole table's."""
    from openinfer_kernels.embed import embedding_part_ref
    from openinfer_kernels.embed.triton import embedding_part_triton

    weight = torch.randn(VOCAB, hidden, generator=torch.Generator().manual_seed(1))
    weight = weight.to(torch.bfloat16).to(DEVICE)
    ids = torch.tensor(IDS["repeats-unsorted"] + [VOCAB - 1, 0, 25, 24], dtype=ids_dtype,
                       device=DEVICE)
    parts = [(0, 25), (25, 50)]
    got = [embedding_part_triton(ids, weight[a:b], a) for a, b in parts]
    want = [embedding_part_ref(ids, weight[a:b], a) for a, b in parts]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)
    assert torch.equal(got[0] + got[1], embedding_ref(ids.long(), weight))
    assert embedding_part_triton(ids[:0], weight, 0).shape == (0, hidden)
