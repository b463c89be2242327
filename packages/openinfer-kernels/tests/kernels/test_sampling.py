"""race_sample: the Triton kernel and the reference draw from softmax(x / T) (min_p-filtered).

They use different noise for the same seed, so they are compared by law, not token by token:
each draws many rows (same logits, a different seed per row) in one launch, and a chi-square
goodness-of-fit test compares the counts with probabilities computed here in numpy float64.
Seeds are fixed, so p-values are deterministic; 1e-3 leaves room for a correct sampler while a
wrong one lands far below (test_chi_square_rejects_a_wrong_temperature).

Without a GPU the kernel runs under the Triton interpreter (tests/conftest.py), where a program
costs the same whatever its tile: `rows_per_program` puts thousands of rows in a few programs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import openinfer_kernels.sampling as sampling
from openinfer_kernels.sampling import SAMPLING_KERNELS, race_sample_ref
from openinfer_kernels.sampling.triton import race_sample_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# 50 distinct logits in a shuffled order spanning ~3 nats, so every id is drawn often enough.
LOGITS = np.random.default_rng(0).permutation(np.linspace(-1.6, 1.4, 50))
VOCAB = len(LOGITS)
N = 20_000


# Interpreted, a program costs the same whatever its tile; compiled, one row is a program.
ROWS_PER_PROGRAM = 4096 if DEVICE == "cpu" else 1


def triton_small(logits, temperature, min_p, seeds):
    """The kernel with a small BLOCK and two splits, so V = 50 exercises the chunked path."""
    return race_sample_triton(logits, temperature, min_p, seeds, block=32, num_splits=2,
                              rows_per_program=ROWS_PER_PROGRAM)


IMPLS = {"triton": triton_small, "reference": race_sample_ref}


def expected(logits: np.ndarray, temperature: float, min_p: float = 0.0) -> np.ndarray:
    x = logits.astype(np.float64) / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    p = np.where(p >= min_p * p.max(), p, 0.0)
    return p / p.sum()


def draw(impl, logits: np.ndarray, temperature: float, min_p: float | None, n: int = N,
         first_seed: int = 0) -> np.ndarray:
    """Counts per id of `n` draws of the same row, each with its own seed, in one launch."""
    x = torch.tensor(logits, dtype=torch.float32, device=DEVICE).expand(n, -1).contiguous()
    t = torch.full((n,), temperature, device=DEVICE)
    mp = None if min_p is None else torch.full((n,), min_p, device=DEVICE)
    seeds = torch.arange(first_seed, first_seed + n, dtype=torch.int64, device=DEVICE)
    ids = impl(x, t, mp, seeds)
    assert ids.dtype == torch.int64 and ids.shape == (n,)
    return np.bincount(ids.cpu().numpy(), minlength=len(logits))


def fit_p_value(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square p-value over the support of `probs`; counts outside it must be zero."""
    support = probs > 0
    assert counts[~support].sum() == 0, f"filtered-out ids drawn: {np.nonzero(counts * ~support)}"
    exp = probs[support] * counts.sum()
    assert exp.min() >= 5, "too few draws for a chi-square test; raise N"
    return float(chisquare(counts[support], exp).pvalue)


CASES = {
    "T 1": (1.0, None),
    "T 0.7": (0.7, None),
    "T 1.8, min_p 0 given": (1.8, 0.0),
    "T 0.8, min_p 0.3": (0.8, 0.3),
}


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS.keys())
@pytest.mark.parametrize(("temperature", "min_p"), CASES.values(), ids=CASES.keys())
def test_draws_fit_the_softmax(impl, temperature, min_p):
    probs = expected(LOGITS, temperature, min_p or 0.0)
    if min_p:
        assert 3 < (probs > 0).sum() < VOCAB - 10  # the filter really filters
    assert fit_p_value(draw(impl, LOGITS, temperature, min_p), probs) > 1e-3


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS.keys())
def test_chi_square_rejects_a_wrong_temperature(impl):
    counts = draw(impl, LOGITS, 1.0, None)
    assert fit_p_value(counts, expected(LOGITS, 1.0)) > 1e-3
    assert fit_p_value(counts, expected(LOGITS, 0.85)) < 1e-6


def test_a_peaked_row_gives_its_tail_the_right_mass():
    """One id holds ~97%: the rare ids are the ones with the smallest noise E, where a careless
    uniform -> exponential conversion loses precision."""
    logits = np.full(12, -3.0)
    logits[7] = 3.0
    logits[2] = -1.0
    counts = draw(triton_small, logits, 1.0, None, n=40_000)
    assert fit_p_value(counts, expected(logits, 1.0)) > 1e-3


def test_tiling_splits_and_block_do_not_change_a_single_draw():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 83, generator=g).to(DEVICE)  # V not a multiple of 4 or of the block
    t = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0, 0.9], device=DEVICE)
    mp = torch.tensor([0.0, 0.05, 0.0, 0.2, 0.0, 0.0], device=DEVICE)
    seeds = torch.tensor([3, -7, 0, 2**63 - 1, -(2**63), 123456789], device=DEVICE)
    base = race_sample_triton(x, t, mp, seeds, block=128, num_splits=1, rows_per_program=8)
    for block, splits, tile in [(16, 3, 1), (32, 2, 4), (64, 1, 2)]:
        got = race_sample_triton(x, t, mp, seeds, block=block, num_splits=splits,
                                 rows_per_program=tile)
        assert torch.equal(got, base), (block, splits, tile)


def test_repeated_launches_agree():
    """The split winners meet through per-row arrival counts kept between launches: each launch
    must leave them at zero, whatever the split count, or the next one picks from stale data."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(5, 90, generator=g).to(DEVICE)
    t = torch.full((5,), 0.7, device=DEVICE)
    seeds = torch.arange(5, device=DEVICE) + 40
    first = race_sample_triton(x, t, None, seeds, block=16, num_splits=6, rows_per_program=2)
    for splits in (3, 1, 6, 2, 6):
        again = race_sample_triton(x, t, None, seeds, block=16, num_splits=splits,
                                   rows_per_program=2)
        assert torch.equal(again, first), splits


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS.keys())
def test_a_seed_fixes_the_draw_wherever_its_row_sits(impl):
    n = 64
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, VOCAB, generator=g).to(DEVICE) * 0.3  # flat: the seed decides
    t = torch.ones(n, device=DEVICE)
    seeds = torch.arange(n, dtype=torch.int64, device=DEVICE) * 1_000_003
    ids = impl(x, t, None, seeds)
    perm = torch.randperm(n, generator=g).to(DEVICE)
    assert torch.equal(impl(x[perm], t, None, seeds[perm]), ids[perm])
    assert len(set(ids.tolist())) > 10  # and different seeds do draw differently


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS.keys())
def test_minus_inf_ids_are_never_drawn(impl):
    n = 512
    x = torch.tensor(LOGITS, dtype=torch.float32).expand(n, -1).clone()
    banned = list(range(0, VOCAB, 3))
    x[:, banned] = float("-inf")
    x[-1] = float("-inf")
    x[-1, 31] = -50.0  # the single allowed id, far below where the others were
    x = x.to(DEVICE)
    t = torch.full((n,), 3.0, device=DEVICE)
    mp = torch.zeros(n, device=DEVICE)
    mp[: n // 2] = 0.01
    ids = impl(x, t, mp, torch.arange(n, device=DEVICE) * 17).tolist()
    assert not set(ids) & set(banned)
    assert ids[-1] == 31


@pytest.mark.parametrize("impl", IMPLS.values(), ids=IMPLS.keys())
def test_greedy_and_tiny_temperature_rows_take_the_argmax(impl):
    x = torch.tensor([
        [0.0, 2.0, 2.0, -1.0, 1.99],                     # greedy: tie, lower id
        [0.0, 2.0, 2.0, -1.0, 1.99],                     # T = 1e-4: 2.0 vs 1.99 is 100 nats
        [float("-inf")] * 5,                             # nothing allowed: id 0, like argmax
        [1.0, 1.0, float("-inf"), 1.0, 1.0],             # sampled beside the greedy rows
        [-1.0, float("-inf"), 5.0, float("-inf"), 4.0],  # greedy with -inf around
    ], device=DEVICE)
    t = torch.tensor([0.0, 1e-4, 0.0, 1.0, 0.0], device=DEVICE)
    for seed in range(20):
        seeds = torch.full((5,), seed, dtype=torch.int64, device=DEVICE)
        ids = impl(x, t, None, seeds).tolist()
        assert ids[0] == 1 and ids[2] == 0 and ids[4] == 2
        assert ids[1] in (1, 2)
        assert ids[3] != 2


def test_greedy_only_launch_is_argmax_in_every_dtype():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 301, generator=g)
    x[3, 10] = x[3, 200] = 9.0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        xd = x.to(dtype).to(DEVICE)
        got = race_sample_triton(xd, torch.zeros(7, device=DEVICE), None,
                                 torch.zeros(7, dtype=torch.int64, device=DEVICE), block=64)
        assert torch.equal(got.cpu(), xd.float().argmax(dim=-1).cpu())


def test_public_op_and_kernels_object():
    x = torch.randn(3, 20)
    t, seeds = torch.ones(3), torch.tensor([1, 2, 3])
    assert torch.equal(sampling.race_sample(x, t, None, seeds), race_sample_ref(x, t, None, seeds))
    assert SAMPLING_KERNELS.supports(torch.device("cuda"))
    assert not SAMPLING_KERNELS.supports(torch.device("cpu"))
    from openinfer_core.interfaces.sampling import SamplingKernels

    assert isinstance(SAMPLING_KERNELS, SamplingKernels)


@pytest.mark.gpu
@pytest.mark.parametrize(("temperature", "min_p"), [(1.0, None), (0.6, None), (1.0, 0.02)])
def test_full_size_peaked_rows_fit(temperature, min_p):
    """Qwen3's vocabulary, batch 256: eight ids spread over the row carry most of the mass, the
    151,928 others share the rest as one bin (which min_p 0.02 removes)."""
    vocab, batch, launches = 151_936, 256, 40
    special = np.array([0, 5, 4095, 4096, 70_001, 100_000, 151_900, 151_935])
    weights = np.array([0.20, 0.05, 0.10, 0.15, 0.08, 0.12, 0.10, 0.05])  # background: 0.15
    background = vocab - len(special)
    logits = np.zeros(vocab)
    logits[special] = np.log(weights / 0.15 * background)
    x = torch.tensor(logits * temperature, dtype=torch.float32, device="cuda")  # softmax(x/T)
    x = x.expand(batch, -1).contiguous()
    t = torch.full((batch,), temperature, device="cuda")
    mp = None if min_p is None else torch.full((batch,), min_p, device="cuda")
    counts = np.zeros(len(special) + 1)
    for launch in range(launches):
        seeds = torch.arange(batch, device="cuda") + launch * batch * 7919
        ids = SAMPLING_KERNELS.race_sample(x, t, mp, seeds).cpu().numpy()
        is_special = ids[:, None] == special[None, :]
        counts[:-1] += is_special.sum(axis=0)
        counts[-1] += (~is_special.any(axis=1)).sum()
    probs = np.append(weights, 0.15)
    if min_p is not None:
        probs[-1] = 0.0  # a background id has p = 1e-6 / 0.2 of the top: below min_p
        probs /= probs.sum()
    assert fit_p_value(counts, probs) > 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 3, 40])
def test_full_size_split_rows_join_exactly(batch):
    """At full size a row spans up to ~75 programs that meet through atomic arrival counts; any
    ordering bug there shows up as a token that differs from the one-program-per-row launch,
    which draws the very same noise."""
    g = torch.Generator(device="cuda").manual_seed(batch)
    t = torch.full((batch,), 0.9, device="cuda")
    mp = torch.full((batch,), 0.001, device="cuda")
    for step in range(50):
        x = torch.randn(batch, 151_936, device="cuda", generator=g)
        seeds = torch.randint(-(2**63), 2**63 - 1, (batch,), device="cuda", generator=g)
        for min_p in (None, mp):
            one = race_sample_triton(x, t, min_p, seeds, num_splits=1)
            split = race_sample_triton(x, t, min_p, seeds)
            assert torch.equal(split, one), step
