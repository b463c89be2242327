"""Several requests in one step through the state slots: staggered arrivals mixing prompt
chunks and decode tokens, a slot reused after its request ends (a row at position 0 starts
from zeros, whatever the slot held), and padding rows sharing slot 0."""

from __future__ import annotations

import pytest
import torch
from checkpoints import write_causal_lm
from harness import Harness, load

from openinfer_qwen35.model import Qwen35Model


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Qwen35Model:  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("qwen35")
    write_causal_lm(folder, tie=False, seed=1)
    return load(folder)


def prompts(n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, 384, (int(5 + 3 * i),), generator=gen).tolist() for i in range(n)]


def test_eight_staggered_requests_match_one_at_a_time(model: Qwen35Model) -> None:
    steps = 12
    alone = [Harness(model).greedy("r", p, steps) for p in prompts(8)]
    h = Harness(model)
    out: dict[int, list[int]] = {}
    pending = {i: p for i, p in enumerate(prompts(8))}
    # Request i arrives at step i; prompts are fed in chunks of 4 beside others' decodes.
    for step in range(60):
        rows, kinds = [], []
        for i in sorted(pending):
            if i <= step:
                rows.append((str(i), pending[i][:4]))
                kinds.append(("prefill", i, len(pending[i]) <= 4))
        for i, toks in out.items():
            if len(toks) < steps:
                rows.append((str(i), [toks[-1]]))
                kinds.append(("decode", i, True))
        if not rows:
            break
        logits = h.step(rows)
        for (kind, i, last), row in zip(kinds, logits, strict=True):
            if kind == "prefill":
                pending[i] = pending[i][4:]
                if last:
                    del pending[i]
                    out[i] = [int(row.argmax())]
            else:
                out[i].append(int(row.argmax()))
        for i in [i for i, toks in out.items() if len(toks) == steps and str(i) in h.requests]:
            h.finish(str(i))
    assert [out[i] for i in range(8)] == alone


def test_a_reused_slot_starts_from_zeros(model: Qwen35Model) -> None:
    first, second = prompts(2)
    h = Harness(model, num_slots=2)
    h.greedy("a", first, 6)
    slot = h.requests["a"].slot
    assert h.model.state is not None and h.model.state.recurrent[:, slot].abs().sum() > 0
    h.finish("a")
    h.add("b", slot=slot)  # the only slot, still holding a's state
    assert h.greedy("b", second, 6) == Harness(model).greedy("b", second, 6)
