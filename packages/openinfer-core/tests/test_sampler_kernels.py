"""The Sampler's kernel path, driven on CPU by a fake `SamplingKernels` written in torch.

What is checked is the Sampler's side of the contract: which rows reach the kernel and with which
temperature, min_p and seed; that top_k / top_p rows arrive already filtered; that seeds keep a
row independent of its batch; and that the whole pipeline still draws vLLM's distribution.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from openinfer_core.interfaces.sampling import SamplingKernels
from openinfer_core.params import SamplingParams
from openinfer_core.sampling.sampler import Sampler, SamplingRow, mix_seed, warm_up_kernels

_MASK64 = (1 << 64) - 1


class FakeKernels:
    """A torch race with one generator per row seed; records every call."""

    def __init__(self, device_type: str = "cpu") -> None:
        self.device_type = device_type
        self.calls: list[dict[str, torch.Tensor | None]] = []

    def supports(self, device: torch.device) -> bool:
        return device.type == self.device_type

    def race_sample(self, logits: torch.Tensor, temperature: torch.Tensor,
                    min_p: torch.Tensor | None, seeds: torch.Tensor) -> torch.Tensor:
        self.calls.append(dict(logits=logits.clone(), temperature=temperature.clone(),
                               min_p=None if min_p is None else min_p.clone(),
                               seeds=seeds.clone()))
        out = []
        for i in range(logits.shape[0]):
            t = float(temperature[i])
            if t <= 0:
                out.append(int(logits[i].argmax()))
                continue
            z = logits[i].float() / t
            if min_p is not None and float(min_p[i]) > 0:
                z = z.masked_fill(z < z.max() + math.log(float(min_p[i])), float("-inf"))
            gen = torch.Generator().manual_seed(int(seeds[i]) & _MASK64)
            e = torch.empty_like(z).exponential_(generator=gen).clamp_(min=1e-30)
            out.append(int((z - e.log()).argmax()))
        return torch.tensor(out, dtype=torch.int64)


def row(params: SamplingParams, output: tuple[int, ...] = (), prompt: tuple[int, ...] = (),
        banned: tuple[int, ...] = ()) -> SamplingRow:
    return SamplingRow(params, prompt, output, banned)


def signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def test_the_fake_satisfies_the_protocol() -> None:
    assert isinstance(FakeKernels(), SamplingKernels)


def test_greedy_only_batches_never_reach_the_kernel() -> None:
    kernels = FakeKernels()
    logits = torch.tensor([[0.0, 3.0, 3.0], [1.0, 0.0, 2.0]])
    rows = [row(SamplingParams(temperature=0.0)), row(SamplingParams(top_k=1, seed=4))]
    out = Sampler(3, kernels=kernels).sample(logits, rows)
    assert [t.token_id for t in out] == [1, 2]
    assert kernels.calls == []


def test_unsupported_device_takes_the_torch_path() -> None:
    kernels = FakeKernels(device_type="cuda")
    logits = torch.zeros(4, 8)
    with_fake = Sampler(8, seed=3, kernels=kernels).sample(logits, [row(SamplingParams())] * 4)
    plain = Sampler(8, seed=3).sample(logits, [row(SamplingParams())] * 4)
    assert kernels.calls == [] and with_fake == plain


def test_rows_reach_the_kernel_with_their_parameters() -> None:
    kernels = FakeKernels()
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.5]] * 4)
    rows = [
        row(SamplingParams(temperature=0.0)),                          # greedy
        row(SamplingParams(temperature=0.5, min_p=0.2, seed=9), output=(1, 2)),
        row(SamplingParams(temperature=2.0, top_k=2)),                 # filtered here
        row(SamplingParams(temperature=1.3)),
    ]
    sampler = Sampler(5, seed=11, kernels=kernels)
    out = sampler.sample(logits, rows)
    (call,) = kernels.calls
    assert call["temperature"].tolist() == pytest.approx([0.0, 0.5, 1.0, 1.3])
    assert call["min_p"] is not None
    assert call["min_p"].tolist() == pytest.approx([0.0, 0.2, 0.0, 0.0])
    seeds = call["seeds"].tolist()
    assert seeds[1] == signed(mix_seed(9, 2))
    assert 0 <= seeds[2] < 2**63 and 0 <= seeds[3] < 2**63 and seeds[2] != seeds[3]
    sent = call["logits"]
    # The top_k row arrives divided by its temperature and masked outside its top 2.
    inf = float("-inf")
    assert sent[2].tolist() == [inf, inf, 1.5, 2.0, inf]
    assert torch.equal(sent[[0, 1, 3]], logits[[0, 1, 3]])  # the others untouched
    assert out[0].token_id == 3 and out[2].token_id in (2, 3)


def test_min_p_is_not_sent_when_no_row_uses_it() -> None:
    kernels = FakeKernels()
    Sampler(4, kernels=kernels).sample(torch.zeros(2, 4), [row(SamplingParams())] * 2)
    assert kernels.calls[0]["min_p"] is None


def test_the_kernel_path_leaves_the_callers_logits_alone() -> None:
    kernels = FakeKernels()
    logits = torch.tensor([[1.0, 2.0, -3.0, 0.5], [0.0, 1.0, 2.0, 3.0]])
    before = logits.clone()
    rows = [row(SamplingParams(top_k=2, top_p=0.9)), row(SamplingParams(top_p=0.5))]
    Sampler(4, kernels=kernels).sample(logits, rows)
    assert torch.equal(logits, before)


def test_penalties_and_bans_apply_before_the_kernel() -> None:
    kernels = FakeKernels()
    logits = torch.tensor([[2.0, 1.0, 0.0, 5.0]])
    params = SamplingParams(repetition_penalty=2.0)
    Sampler(4, kernels=kernels).sample(logits, [row(params, output=(0,), banned=(3,))])
    assert kernels.calls[0]["logits"].tolist() == [[1.0, 1.0, 0.0, float("-inf")]]


def _run_seeded(position: int, batch: int, sampler_seed: int, steps: int = 8) -> list[int]:
    """A seeded request decoded at `position` among unseeded and other-seeded rows."""
    sampler = Sampler(64, seed=sampler_seed, kernels=FakeKernels())
    noise = torch.Generator().manual_seed(sampler_seed)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    out: list[int] = []
    for step in range(steps):
        logits = torch.randn(batch, 64, generator=noise)
        logits[position] = torch.randn(64, generator=torch.Generator().manual_seed(step)) * 0.5
        rows = [row(SamplingParams(seed=None if j % 2 else 77 + j), output=(1,) * step)
                for j in range(batch)]
        rows[position] = row(params, output=tuple(out))
        out.append(sampler.sample(logits, rows)[position].token_id)
    return out


def test_seeded_rows_do_not_depend_on_their_batch() -> None:
    alone = _run_seeded(0, 1, 0)
    assert len(set(alone)) > 1  # the stream moves on with the output length
    for position, batch, sampler_seed in [(1, 3, 5), (7, 8, 9), (0, 17, 11)]:
        assert _run_seeded(position, batch, sampler_seed) == alone


def test_unseeded_rows_follow_the_sampler_seed() -> None:
    logits = torch.zeros(32, 16)
    rows = [row(SamplingParams())] * 32

    def draw(seed: int) -> list[int]:
        sampler = Sampler(16, seed=seed, kernels=FakeKernels())
        return [t.token_id for _ in range(2) for t in sampler.sample(logits, rows)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    assert draw(7)[:32] != draw(7)[32:]  # a fresh seed every step


def test_logprobs_come_back_on_the_kernel_path() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 10)
    rows = [row(SamplingParams(logprobs=2, top_k=4)), row(SamplingParams(temperature=0.0)),
            row(SamplingParams(logprobs=0, seed=3))]
    out = Sampler(10, kernels=FakeKernels()).sample(logits, rows)
    raw = torch.log_softmax(logits, dim=-1)
    for i in (0, 2):
        assert out[i].logprob == pytest.approx(raw[i, out[i].token_id].item(), abs=1e-6)
    assert [t for t, _ in out[0].top_logprobs] == raw[0].argsort(descending=True)[:2].tolist()
    assert out[1].logprob is None and out[2].top_logprobs == ()


# The pipeline's law: the same oracle as test_sampler_stats, without penalties.
LOGITS = np.array([0.3, -1.1, 2.0, 0.9, -2.5, 1.5, 0.0, -0.4, 1.2, -1.7, 0.5, -0.8])


def oracle(p: SamplingParams) -> np.ndarray:
    x = LOGITS / p.temperature
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    keep = probs >= p.min_p * probs.max()
    if p.top_k > 1:
        keep &= x >= np.sort(np.where(keep, x, -np.inf))[::-1][p.top_k - 1]
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        above = np.cumsum(probs[order]) - probs[order]
        probs[order[above >= p.top_p]] = 0.0
        probs /= probs.sum()
    return probs


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0.7),
    dict(temperature=1.3, min_p=0.1),
    dict(temperature=0.9, top_k=5, top_p=0.7),
    dict(temperature=1.3, min_p=0.05, top_k=6, top_p=0.9),
], ids=["T", "min_p", "top_k+top_p", "min_p+top_k+top_p"])
def test_the_kernel_path_draws_the_right_distribution(kwargs: dict[str, float]) -> None:
    n = 6000
    params = SamplingParams(**kwargs)  # type: ignore[arg-type]
    logits = torch.tensor(LOGITS, dtype=torch.float32).expand(n, -1).contiguous()
    out = Sampler(len(LOGITS), kernels=FakeKernels()).sample(logits, [row(params)] * n)
    counts = np.bincount([t.token_id for t in out], minlength=len(LOGITS))
    probs = oracle(params)
    assert counts[probs == 0].sum() == 0
    assert chisquare(counts[probs > 0], probs[probs > 0] * n).pvalue > 1e-3


def test_row_params_upload_round_trips_and_reuses_its_buffers() -> None:
    from openinfer_core.sampling.row_params import RowParamUpload

    up = RowParamUpload()
    cpu = torch.device("cpu")
    for n in (3, 1, 300, 3):  # shrink, grow past the first buffer, come back
        temps = [0.5 + i for i in range(n)]
        mins = [0.01 * i for i in range(n)]
        seeds = [-(2**63) + i if i % 2 else 2**63 - 1 - i for i in range(n)]
        t, m, s = up.upload(temps, mins, seeds, cpu)
        assert t.dtype == m.dtype == torch.float32 and s.dtype == torch.int64
        assert t.tolist() == pytest.approx(temps) and m.tolist() == pytest.approx(mins)
        assert s.tolist() == seeds


class NucleusKernels(FakeKernels):
    """The fake with `top_p_sample`: its race over each row's nucleus, found by a stable sort."""

    def __init__(self) -> None:
        super().__init__()
        self.top_p_calls: list[dict[str, torch.Tensor]] = []

    def top_p_sample(self, logits: torch.Tensor, top_p: torch.Tensor,
                     seeds: torch.Tensor) -> torch.Tensor:
        self.top_p_calls.append(dict(logits=logits.clone(), top_p=top_p.clone(),
                                     seeds=seeds.clone()))
        sorted_x, order = logits.sort(dim=-1, descending=True, stable=True)
        probs = sorted_x.softmax(dim=-1)
        outside = (probs.cumsum(dim=-1) - probs) >= top_p.unsqueeze(1)
        nucleus = torch.empty_like(logits).scatter_(
            -1, order, sorted_x.masked_fill(outside, float("-inf")))
        ones = torch.ones(logits.shape[0])
        return FakeKernels().race_sample(nucleus, ones, None, seeds)  # not recorded


def test_top_p_rows_race_in_their_nucleus_with_the_same_tokens() -> None:
    """Rows with top_p alone go to `top_p_sample` (scaled by T, min_p applied, with their own
    seeds); top_k rows are still filtered here. The tokens are the ones the filter-then-race
    path draws from the same seeds."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 40, generator=g) * 3
    params = [SamplingParams(temperature=0.8, top_p=0.7, seed=1),
              SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.2, top_k=5, top_p=0.9, seed=2),
              SamplingParams(temperature=0.5, top_p=0.95, min_p=0.05, seed=3),
              SamplingParams(temperature=1.0, seed=4),
              SamplingParams(temperature=1.0, top_p=0.3, seed=5)]
    rows = [row(p, output=(1, 2)) for p in params]
    kernels = NucleusKernels()
    got = Sampler(40, kernels=kernels).sample(logits, rows)
    want = Sampler(40, kernels=FakeKernels()).sample(logits, rows)
    assert [t.token_id for t in got] == [t.token_id for t in want]
    (call,) = kernels.top_p_calls
    assert call["top_p"].tolist() == pytest.approx([0.7, 0.95, 0.3])
    assert call["seeds"].tolist() == [signed(mix_seed(s, 2)) for s in (1, 3, 5)]
    torch.testing.assert_close(call["logits"][0], logits[0] / 0.8)
    assert call["logits"][1].isinf().any() and not call["logits"][0].isinf().any()  # min_p
    (race,) = kernels.calls  # the others, the nucleus rows among them as greedy
    assert race["temperature"].tolist() == pytest.approx([0.0, 0.0, 1.0, 0.0, 1.0, 0.0])


def test_a_batch_of_top_p_rows_only_launches_no_race() -> None:
    kernels = NucleusKernels()
    rows = [row(SamplingParams(temperature=1.0, top_p=0.5, seed=i)) for i in range(3)]
    out = Sampler(8, kernels=kernels).sample(torch.randn(3, 8), rows)
    assert len(out) == 3 and not kernels.calls and len(kernels.top_p_calls) == 1


class FusedKernels(NucleusKernels):
    """The nucleus fake plus `top_k_top_p_sample` (the last id of each row, recorded) and
    `warm_up`."""

    def __init__(self) -> None:
        super().__init__()
        self.fused_calls: list[dict[str, torch.Tensor]] = []
        self.warmed: list[tuple[torch.device, int]] = []

    def top_k_top_p_sample(self, logits: torch.Tensor, top_k: torch.Tensor,
                           top_p: torch.Tensor, seed: int) -> torch.Tensor:
        self.fused_calls.append(dict(logits=logits.clone(), top_k=top_k.clone(),
                                     top_p=top_p.clone(), seed=torch.tensor(seed)))
        return torch.full((logits.shape[0],), logits.shape[1] - 1, dtype=torch.int64)

    def warm_up(self, device: torch.device, vocab_size: int) -> None:
        self.warmed.append((device, vocab_size))


def test_unseeded_top_k_top_p_rows_go_to_the_fused_draw() -> None:
    """Rows without a seed or min_p that filter by top_k or top_p are drawn by
    `top_k_top_p_sample`; seeded ones keep the race (batch-independent), min_p rows too."""
    logits = torch.randn(6, 30, generator=torch.Generator().manual_seed(8))
    params = [SamplingParams(temperature=0.5, top_k=20, top_p=0.95),  # fused
              SamplingParams(temperature=0.7, top_p=0.9, seed=3),  # seeded: nucleus race
              SamplingParams(temperature=1.0),  # plain race
              SamplingParams(temperature=2.0, top_p=0.8),  # fused, top_k none
              SamplingParams(temperature=1.0, top_k=5, min_p=0.1),  # min_p: filtered here
              SamplingParams(temperature=0.0)]
    kernels = FusedKernels()
    out = Sampler(30, kernels=kernels).sample(logits, [row(p) for p in params])
    ids = [t.token_id for t in out]
    assert ids[0] == 29 and ids[3] == 29 and ids[5] == int(logits[5].argmax())
    (fused,) = kernels.fused_calls
    assert fused["top_k"].tolist() == [20, 30] and fused["top_k"].dtype == torch.int32
    assert fused["top_p"].tolist() == pytest.approx([0.95, 0.8])
    torch.testing.assert_close(fused["logits"], logits[[0, 3]] / torch.tensor([[0.5], [2.0]]))
    assert len(kernels.top_p_calls) == 1 and kernels.top_p_calls[0]["top_p"].tolist() == \
        pytest.approx([0.9])
    (race,) = kernels.calls
    assert race["temperature"].tolist() == pytest.approx([0.0, 0.0, 1.0, 0.0, 1.0, 0.0])


def test_fused_draws_get_a_fresh_seed_and_never_rows_with_banned_ids() -> None:
    kernels = FusedKernels()
    sampler = Sampler(30, seed=5, kernels=kernels)
    params = SamplingParams(temperature=1.0, top_k=10)
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(1))
    sampler.sample(logits, [row(params), row(params, banned=(3,))])
    sampler.sample(logits, [row(params), row(params, banned=(3,))])
    first, second = kernels.fused_calls
    assert first["top_k"].tolist() == [10] and second["top_k"].tolist() == [10]  # row 0 only
    assert int(first["seed"]) != int(second["seed"])
    again = FusedKernels()
    Sampler(30, seed=5, kernels=again).sample(logits, [row(params), row(params, banned=(3,))])
    assert int(again.fused_calls[0]["seed"]) == int(first["seed"])  # the sampler's seed


def test_warm_up_reaches_kernels_that_support_the_device() -> None:
    kernels = FusedKernels()
    warm_up_kernels(kernels, torch.device("cpu"), 30)
    assert kernels.warmed == [(torch.device("cpu"), 30)]
    elsewhere = FusedKernels()
    elsewhere.device_type = "cuda"
    warm_up_kernels(elsewhere, torch.device("cpu"), 30)  # not its device: no call
    assert elsewhere.warmed == []
    warm_up_kernels(FakeKernels(), torch.device("cpu"), 30)  # kernels without warm_up
