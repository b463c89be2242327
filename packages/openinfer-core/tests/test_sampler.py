"""Sampler behaviour on tiny vocabularies: exact values, exact ids, exact reproducibility.

The distribution-level checks (chi-square against a numpy reference) are in test_sampler_stats.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from openinfer_core.params import SamplingParams
from openinfer_core.sampling.penalties import apply_banned, apply_penalties
from openinfer_core.sampling.sampler import (
    SampledToken,
    Sampler,
    SamplingRow,
    apply_top_k_top_p,
)

GREEDY = SamplingParams(temperature=0.0)


def row(params: SamplingParams, prompt: tuple[int, ...] = (), output: tuple[int, ...] = (),
        banned: tuple[int, ...] = ()) -> SamplingRow:
    return SamplingRow(params, prompt, output, banned)


def test_greedy_is_argmax_and_ties_go_to_the_lower_id() -> None:
    logits = torch.tensor([
        [0.1, 3.0, 3.0, 2.0, -1.0],   # tie between 1 and 2
        [5.0, 5.0, 5.0, 5.0, 5.0],    # all equal
        [-3.0, -2.0, -1.0, -4.0, -1.0],
        [0.0, 0.0, 0.0, 0.0, 9.0],
    ])
    rows = [row(GREEDY), row(GREEDY), row(SamplingParams(top_k=1)), row(GREEDY)]
    out = Sampler(vocab_size=5).sample(logits, rows)
    assert [t.token_id for t in out] == [1, 0, 2, 4]


def test_penalties_match_hand_computed_values() -> None:
    logits = torch.tensor([
        [1.0, -1.0, 2.0, 0.5, -0.5, 3.0],
        [1.0, -1.0, 2.0, 0.5, -0.5, 3.0],
    ])
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    rows = [
        row(SamplingParams(), prompt=(0, 1), output=(2, 2, 4)),  # no penalties: untouched
        row(params, prompt=(0, 1), output=(2, 2, 4)),
    ]
    apply_penalties(logits, rows)
    expected = [
        1.0 / 2.0,               # prompt token, positive: divided by r
        -1.0 * 2.0,              # prompt token, negative: multiplied by r
        2.0 / 2.0 - 0.5 * 2 - 0.25,   # output twice: repetition, then frequency * 2 + presence
        0.5,                     # never seen
        -0.5 * 2.0 - 0.5 * 1 - 0.25,  # output once, negative
        3.0,                     # never seen
    ]
    assert logits[0].tolist() == [1.0, -1.0, 2.0, 0.5, -0.5, 3.0]
    assert logits[1].tolist() == pytest.approx(expected, abs=1e-6)


def test_frequency_and_presence_ignore_the_prompt() -> None:
    logits = torch.zeros(1, 4)
    apply_penalties(logits, [row(SamplingParams(frequency_penalty=1.0, presence_penalty=1.0),
                                 prompt=(0, 0, 1), output=(3,))])
    assert logits[0].tolist() == [0.0, 0.0, 0.0, -2.0]


def test_penalties_steer_greedy_choice() -> None:
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    plain = Sampler(3).sample(logits, [row(GREEDY, output=(0,))])
    penalised = Sampler(3).sample(
        logits, [row(SamplingParams(temperature=0.0, repetition_penalty=1.2), output=(0,))]
    )
    assert plain[0].token_id == 0
    assert penalised[0].token_id == 1  # 2.0 / 1.2 < 1.9


def test_apply_banned_sets_minus_inf_only_where_asked() -> None:
    logits = torch.zeros(3, 4)
    apply_banned(logits, [row(GREEDY, banned=(1, 3)), row(GREEDY), row(GREEDY, banned=(0,))])
    inf = -math.inf
    assert logits.tolist() == [[0, inf, 0, inf], [0, 0, 0, 0], [inf, 0, 0, 0]]


def test_banned_ids_are_never_chosen() -> None:
    n = 4000
    logits = torch.tensor([[0.0, 8.0, 1.0, 7.5]]).expand(n, 4).contiguous()
    rows = [row(SamplingParams(temperature=2.0), banned=(1, 3)) for _ in range(n - 1)]
    rows.append(row(GREEDY, banned=(1,)))
    ids = [t.token_id for t in Sampler(4, seed=3).sample(logits, rows)]
    assert 1 not in ids and 3 not in ids[:-1]
    assert ids[-1] == 3
    assert {0, 2} <= set(ids)  # both allowed tokens do come up


def test_sampler_does_not_mutate_the_callers_logits() -> None:
    logits = torch.tensor([[1.0, 2.0, -3.0, 0.5], [0.0, 1.0, 2.0, 3.0]])
    before = logits.clone()
    params = SamplingParams(temperature=0.8, top_k=2, top_p=0.9, min_p=0.1,
                            repetition_penalty=1.5, frequency_penalty=0.3)
    Sampler(4).sample(logits, [row(params, (0,), (1, 2), (3,)), row(GREEDY, banned=(3,))])
    assert torch.equal(logits, before)


def test_logprobs_are_of_the_raw_distribution() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 10)
    logits[2, 3] = logits[2, 7] = 4.0  # a tie in the top-N: lower id first
    shaped = dict(temperature=0.5, top_k=3, repetition_penalty=1.7, presence_penalty=1.0)
    rows = [
        row(SamplingParams(logprobs=3, **shaped), prompt=(0, 1, 2), output=(4,), banned=(5,)),
        row(SamplingParams(temperature=0.0, logprobs=0)),
        row(SamplingParams(logprobs=20)),  # more than V: all of them
        row(SamplingParams()),             # logprobs off
    ]
    out = Sampler(10).sample(logits, rows)
    raw = torch.log_softmax(logits, dim=-1)

    for i in range(3):
        assert out[i].logprob == pytest.approx(raw[i, out[i].token_id].item(), abs=1e-6)
    assert out[3] == SampledToken(out[3].token_id, None, ())
    assert out[1].top_logprobs == ()
    assert len(out[0].top_logprobs) == 3 and len(out[2].top_logprobs) == 10

    for i in (0, 2):
        top = out[i].top_logprobs
        values = [lp for _, lp in top]
        assert values == sorted(values, reverse=True)
        order = sorted(range(10), key=lambda t: (-raw[i, t].item(), t))
        assert [t for t, _ in top] == order[: len(top)]
        for t, lp in top:
            assert lp == pytest.approx(raw[i, t].item(), abs=1e-6)
    assert [t for t, _ in out[2].top_logprobs[:2]] == [3, 7]


def test_top_logprob_ties_keep_id_order_in_a_large_vocab() -> None:
    # torch.topk orders ties arbitrarily at this size; the contract says lower id first.
    logits = torch.zeros(2, 1000)
    logits[1, ::3] = 1.0
    out = Sampler(1000).sample(logits, [row(SamplingParams(temperature=0.0, logprobs=20))] * 2)
    assert [t for t, _ in out[0].top_logprobs] == list(range(20))
    assert [t for t, _ in out[1].top_logprobs] == list(range(0, 60, 3))


def test_top_k_top_p_keep_exactly_the_right_ids() -> None:
    x = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, 2.5]]).expand(4, 6)
    params = [
        SamplingParams(top_k=3),
        SamplingParams(top_p=0.5),    # probs by rank .46 .28 .17 .06: ids 1 and 5
        SamplingParams(top_p=0.01),   # always keeps the top token
        # renormalised over the top 4, the mass above id 2 is .936; before, .907
        SamplingParams(top_k=4, top_p=0.92),
    ]
    kept = torch.isfinite(apply_top_k_top_p(x, params))
    assert [torch.nonzero(r).flatten().tolist() for r in kept] == [
        [1, 3, 5], [1, 5], [1], [1, 3, 5],
    ]
    # Survivors keep their values: filtering masks, it does not rescale.
    assert apply_top_k_top_p(x, params)[0, 5].item() == 2.5


def test_top_p_one_keeps_even_a_vanishing_tail() -> None:
    # In fp32 the cumulative mass reaches exactly 1.0 after the first token here; a
    # `mass_above >= top_p` test without the top_p < 1 exemption would drop the whole tail.
    x = torch.full((1, 100), -30.0)
    x[0, 0] = 0.0
    out = apply_top_k_top_p(x, [SamplingParams(top_p=1.0, top_k=50)])
    assert torch.isfinite(out).sum().item() == 50


def _random_logits(step: int, vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(vocab, generator=gen) * 0.5  # flat enough that seeds matter


def _run_seeded(seed: int, steps: int, batch: int, position: int, sampler_seed: int,
                vocab: int = 64) -> list[int]:
    """Decode `steps` tokens for one seeded request placed at `position` among `batch - 1`
    other requests (some unseeded, some with other seeds) that get their own random logits."""
    sampler = Sampler(vocab, seed=sampler_seed)
    noise = torch.Generator().manual_seed(sampler_seed)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
    out: list[int] = []
    for step in range(steps):
        logits = torch.randn(batch, vocab, generator=noise)
        logits[position] = _random_logits(step, vocab)
        rows = [row(SamplingParams(seed=None if j % 2 else 77 + j), output=(1,) * step)
                for j in range(batch)]
        rows[position] = row(params, prompt=(5, 6), output=tuple(out))
        out.append(sampler.sample(logits, rows)[position].token_id)
    return out


def test_seeded_row_is_independent_of_its_batch() -> None:
    alone = _run_seeded(seed=1234, steps=10, batch=1, position=0, sampler_seed=0)
    for batch, position, sampler_seed in [(3, 1, 5), (8, 7, 9), (17, 0, 11), (17, 16, 0)]:
        assert _run_seeded(1234, 10, batch, position, sampler_seed) == alone


def test_different_seeds_give_different_sequences() -> None:
    runs = {tuple(_run_seeded(seed, 10, 1, 0, 0)) for seed in (1, 2, 3, 2**63, -5)}
    assert len(runs) == 5


def test_seeded_noise_changes_from_step_to_step() -> None:
    """The seed is mixed with the output length: on flat logits a seeded request must not
    repeat one token forever, as it would if every step reused the same noise."""
    sampler = Sampler(64)
    params = SamplingParams(seed=42)
    out: list[int] = []
    for _ in range(10):
        out.append(sampler.sample(torch.zeros(1, 64), [row(params, output=tuple(out))])[0].token_id)
    assert len(set(out)) > 1


def test_unseeded_rows_follow_the_sampler_seed() -> None:
    logits = torch.zeros(32, 16)
    rows = [row(SamplingParams())] * 32

    def draw(seed: int) -> list[int]:
        return [t.token_id for t in Sampler(16, seed=seed).sample(logits, rows)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_wrong_shape_is_refused_and_empty_batch_is_fine() -> None:
    sampler = Sampler(8)
    with pytest.raises(ValueError, match="vocab_size 8"):
        sampler.sample(torch.zeros(2, 9), [row(GREEDY), row(GREEDY)])
    with pytest.raises(ValueError, match="3 rows"):
        sampler.sample(torch.zeros(2, 8), [row(GREEDY)] * 3)
    assert sampler.sample(torch.zeros(0, 8), []) == []
