"""MaxTokens and RunPlan without a server: each prompt's max_tokens, seeds and prompt scores."""

from __future__ import annotations

import pytest

from openinfer_core.params import SamplingParams
from openinfer_server.errors import APIError
from openinfer_server.prompts import MaxTokens
from openinfer_server.run_plan import RunPlan

LEN = 100  # the model's length in these tests


def chat_limit(requested: int | None, default: int | None = None) -> MaxTokens:
    return MaxTokens(requested, default, param="max_completion_tokens", where="messages")


@pytest.mark.parametrize(("limit", "prompt_tokens", "expected"), [
    (chat_limit(7), 90, 7),  # requested and fits
    (chat_limit(None), 90, 10),  # unrequested, no default: the room left
    (chat_limit(None, default=5), 90, 5),  # the default when it fits
    (chat_limit(None, default=50), 90, 10),  # capped by the room left
    (MaxTokens(0, 16, param="max_tokens", where="prompt"), 99, 1),  # score only: one token
])
def test_for_prompt_never_exceeds_the_ceiling(limit: MaxTokens, prompt_tokens: int,
                                              expected: int) -> None:
    assert limit.for_prompt(prompt_tokens, LEN) == expected
    assert expected <= limit.ceiling(LEN)


def test_ceiling_is_the_request_or_the_model_length() -> None:
    assert chat_limit(7).ceiling(LEN) == 7
    assert chat_limit(None, default=5).ceiling(LEN) == LEN
    assert MaxTokens(0, 16, param="max_tokens", where="prompt").ceiling(LEN) == 1


def test_score_only_is_max_tokens_zero() -> None:
    assert MaxTokens(0, 16, param="max_tokens", where="prompt").score_only
    assert not chat_limit(1).score_only
    assert not chat_limit(None).score_only


@pytest.mark.parametrize(("limit", "prompt_tokens", "param", "numbers"), [
    (chat_limit(20), 90, "max_completion_tokens", "110 tokens (90 in the messages, 20 in"),
    (chat_limit(None), 100, "messages", "101 tokens (100 in the messages, 1 in"),
    (chat_limit(None, default=5), 100, "messages", "105 tokens (100 in the messages, 5 in"),
])
def test_a_prompt_that_does_not_fit_names_the_field(limit: MaxTokens, prompt_tokens: int,
                                                    param: str, numbers: str) -> None:
    with pytest.raises(APIError) as info:
        limit.for_prompt(prompt_tokens, LEN)
    body = info.value.body()["error"]
    assert body["param"] == param
    assert body["code"] == "context_length_exceeded"
    assert numbers in body["message"]


def test_each_choice_gets_its_seed_max_tokens_and_prompt_scores() -> None:
    sampling = SamplingParams(seed=10, max_tokens=LEN, prompt_logprobs=2)
    plan = RunPlan(sampling, chat_limit(None), n=3, prompt_scores=True, scores_once=True)
    params = [plan.params(i, 4) for i in range(3)]
    assert [p.seed for p in params] == [10, 11, 12]
    assert [p.max_tokens for p in params] == [4, 4, 4]
    assert [p.prompt_logprobs for p in params] == [2, None, None]
    assert [plan.scores(i) for i in range(3)] == [True, False, False]


def test_echo_keeps_the_engines_prompt_logprobs_on_every_choice() -> None:
    """Completions' echo with logprobs asks for the prompt's logprobs without vLLM's field."""
    sampling = SamplingParams(logprobs=1, prompt_logprobs=1)
    plan = RunPlan(sampling, MaxTokens(None, 16, param="max_tokens", where="prompt"), n=2,
                   echo=True)
    assert plan.echo_logprobs
    assert [plan.params(i, 16).prompt_logprobs for i in range(2)] == [1, 1]
    assert [plan.scores(i) for i in range(2)] == [False, False]
