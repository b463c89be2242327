"""Qwen3.5 against transformers on CPU in fp32, on tiny checkpoints written by transformers
that mix Gated DeltaNet and full-attention layers: prefill logits within 1e-4 and 32-token
greedy continuations identical, decoding step by step through the state slots."""

from __future__ import annotations

import pytest
import torch
from checkpoints import write_causal_lm
from harness import Harness, load

PROMPT = [5, 17, 250, 3, 99, 42, 7, 301, 64, 12, 8, 150, 77, 200, 31, 9, 4, 120, 66, 2, 18]


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def pair(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("qwen35")
    hf = write_causal_lm(folder, tie=request.param)
    return hf, load(folder)


def hf_greedy(hf, prompt: list[int], steps: int) -> list[int]:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps,
                          do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_prefill_logits_match_transformers(pair) -> None:  # type: ignore[no-untyped-def]
    hf, model = pair
    with torch.no_grad():
        expected = hf(torch.tensor([PROMPT])).logits[0]
    got = Harness(model).step([("a", PROMPT)], all_logits=True)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_greedy_32_tokens_match_transformers(pair) -> None:  # type: ignore[no-untyped-def]
    hf, model = pair
    expected = hf_greedy(hf, PROMPT, 32)
    assert len(set(expected)) > 4  # a continuation that tells models apart
    assert Harness(model).greedy("a", PROMPT, 32) == expected


def test_chunked_prefill_carries_the_state(pair) -> None:  # type: ignore[no-untyped-def]
    hf, model = pair
    # Chunks of 5: some end mid-block, one chunk of a single token comes next to longer ones.
    assert Harness(model).greedy("a", PROMPT, 32, chunk=5) == hf_greedy(hf, PROMPT, 32)
