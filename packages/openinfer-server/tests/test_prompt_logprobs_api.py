"""Prompt logprobs on the wire: completions `echo` + `logprobs` (what lm-eval's loglikelihood
tasks send), `max_tokens: 0` with echo, and vLLM's `prompt_logprobs`. The values themselves are
checked against transformers in tests/test_prompt_logprobs.py; here, that every form reports
the same numbers in its own shape."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest
from live_server import MODEL

from openinfer_core.text.tokenizer import Tokenizer

PROMPT = "The capital of France is Paris, and the capital of Spain is"


def complete(client: openai.OpenAI, **kwargs: Any) -> Any:
    args: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "temperature": 0.0,
                            "max_tokens": 3, **kwargs}
    extra = {"ignore_eos": True, **args.pop("extra_body", {})}
    return client.completions.create(**args, extra_body=extra)


def vllm_scores(client: openai.OpenAI, top: int = 2) -> list[dict[str, Any] | None]:
    out = complete(client, extra_body={"prompt_logprobs": top})
    scores = out.choices[0].prompt_logprobs  # type: ignore[attr-defined]
    assert isinstance(scores, list)
    return scores


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI,
                                              tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(PROMPT)
    out = complete(client, echo=True, logprobs=1)
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT)
    assert len(lp.tokens) == len(ids) + 3 == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.tokens[:len(ids)] == [tokenizer.decode([i]) for i in ids]
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[len(ids)] == len(PROMPT)
    # Each prompt position's top-1 map holds the prompt token itself.
    for i in range(1, len(ids)):
        assert lp.tokens[i] in lp.top_logprobs[i]
    # The same numbers as vLLM's prompt_logprobs field.
    scores = vllm_scores(client)
    assert scores[0] is None and len(scores) == len(ids)
    for i in range(1, len(ids)):
        entry = scores[i][str(ids[i])]
        assert math.isclose(entry["logprob"], lp.token_logprobs[i], abs_tol=1e-5)
        assert entry["decoded_token"] == tokenizer.decode([ids[i]])
    # The generated part is unchanged by echo.
    plain = complete(client, logprobs=1)
    assert choice.text == PROMPT + plain.choices[0].text
    assert lp.token_logprobs[len(ids):] == pytest.approx(plain.choices[0].logprobs.token_logprobs)


def test_max_tokens_zero_with_echo_only_scores(client: openai.OpenAI,
                                               tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(PROMPT)
    out = complete(client, echo=True, logprobs=0, max_tokens=0)
    choice = out.choices[0]
    assert choice.text == PROMPT
    assert choice.finish_reason == "length"
    assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens == len(ids)
    assert len(choice.logprobs.token_logprobs) == len(ids)
    with pytest.raises(openai.BadRequestError):
        complete(client, max_tokens=0)  # without echo there is nothing to return


def test_vllm_prompt_logprobs_ranks_and_top(client: openai.OpenAI,
                                            tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(PROMPT)
    scores = vllm_scores(client, top=3)
    for i in range(1, len(ids)):
        entry = scores[i]
        assert entry is not None and str(ids[i]) in entry
        ranked = sorted(entry.values(), key=lambda e: e["rank"])
        assert [e["rank"] for e in ranked[:3]] == [1, 2, 3]
        assert ranked[0]["logprob"] >= ranked[1]["logprob"] >= ranked[2]["logprob"]
        mine = entry[str(ids[i])]
        assert mine["rank"] >= 1 and (mine["rank"] > 3 or mine in ranked[:3])


def test_streamed_echo_sends_prompt_logprobs_first(client: openai.OpenAI,
                                                   tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(PROMPT)
    chunks = list(complete(client, echo=True, logprobs=1, stream=True))
    first = chunks[0].choices[0]
    assert first.text == PROMPT
    assert first.logprobs.token_logprobs[0] is None
    assert len(first.logprobs.tokens) == len(ids)
    whole = complete(client, echo=True, logprobs=1)
    streamed = [x for c in chunks for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(whole.choices[0].logprobs.token_logprobs)


def test_bad_prompt_logprobs_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, extra_body={"prompt_logprobs": 21})
    assert "prompt_logprobs" in str(info.value)


def test_chat_prompt_logprobs_cover_the_rendered_conversation(client: openai.OpenAI,
                                                              tokenizer: Tokenizer) -> None:
    """Chat puts vLLM's list at the top level (one prompt for all choices), over the tokens
    the template made, with the same numbers as completing that text."""
    args: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "temperature": 0.0, "n": 2,
                            "messages": [{"role": "user", "content": PROMPT}]}
    out = client.chat.completions.create(**args, extra_body={"prompt_logprobs": 1})
    scores = out.prompt_logprobs  # type: ignore[attr-defined]
    assert len(scores) == out.usage.prompt_tokens and scores[0] is None
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}],
                                         add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    same = client.completions.create(model=MODEL, prompt=ids, max_tokens=1,
                                     extra_body={"prompt_logprobs": 1})
    expected = same.choices[0].prompt_logprobs  # type: ignore[attr-defined]
    for mine, theirs, tok in zip(scores[1:], expected[1:], ids[1:], strict=True):
        assert mine[str(tok)]["logprob"] == pytest.approx(theirs[str(tok)]["logprob"], abs=1e-5)
    streamed = [c for c in client.chat.completions.create(
        **args, stream=True, extra_body={"prompt_logprobs": 1})]
    carrying = [c for c in streamed if getattr(c, "prompt_logprobs", None) is not None]
    assert len(carrying) == 1 and carrying[0].prompt_logprobs == scores  # type: ignore[attr-defined]
    assert "prompt_logprobs" not in client.chat.completions.create(**args).model_extra
