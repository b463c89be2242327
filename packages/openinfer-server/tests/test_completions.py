"""/v1/completions through the official openai client against a live server."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest
from live_server import ALIAS, MODEL, LiveServer

from openinfer_core.text.tokenizer import Tokenizer

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0.0}
NO_EOS = {"ignore_eos": True}


def complete(client: openai.OpenAI, **kwargs: object) -> Any:  # a completion, or a stream
    args: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, **GREEDY}
    args.update(kwargs)
    extra = {**NO_EOS, **args.pop("extra_body", {})}
    return client.completions.create(**args, extra_body=extra)


def test_greedy_text_usage_and_decoding(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    out = complete(client, max_tokens=10)
    assert out.object == "text_completion" and out.model == MODEL
    assert out.id.startswith("cmpl-")
    [choice] = out.choices
    assert choice.index == 0 and choice.finish_reason == "length"
    prompt_ids = tokenizer.encode(PROMPT)
    assert out.usage is not None
    assert out.usage.prompt_tokens == len(prompt_ids)
    assert out.usage.completion_tokens == 10
    assert out.usage.total_tokens == len(prompt_ids) + 10
    assert out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens is not None
    again = complete(client, max_tokens=10)
    assert again.choices[0].text == choice.text  # greedy is deterministic


def test_alias_is_accepted_and_first_name_reported(client: openai.OpenAI) -> None:
    out = complete(client, model=ALIAS, max_tokens=2)
    assert out.model == MODEL


def test_token_id_prompt_equals_text_prompt(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    text = complete(client).choices[0].text
    ids = complete(client, prompt=tokenizer.encode(PROMPT)).choices[0].text
    assert ids == text


def test_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0,
                                    extra_body=NO_EOS)
    assert out.usage is not None and out.usage.completion_tokens == 16
    assert out.choices[0].finish_reason == "length"


def test_several_prompts_times_n_are_prompt_major(client: openai.OpenAI,
                                                  tokenizer: Tokenizer) -> None:
    prompts = ["Hello", "Hi there, you", "Once upon a time"]
    out = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=5, seed=7,
                                    temperature=1.0, extra_body=NO_EOS)
    assert [c.index for c in out.choices] == list(range(6))
    alone = [complete(client, prompt=p, max_tokens=5, temperature=1.0, seed=7 + i)
             .choices[0].text for p in prompts for i in range(2)]
    assert [c.text for c in out.choices] == alone
    prompt_tokens = sum(len(tokenizer.encode(p)) for p in prompts)
    assert out.usage is not None
    assert out.usage.prompt_tokens == prompt_tokens  # each prompt counted once, not n times
    assert out.usage.completion_tokens == 30


def test_several_token_id_prompts(client: openai.OpenAI) -> None:
    prompts = [[9707, 11, 1879], [1, 2, 3, 4, 5]]
    out = complete(client, prompt=prompts, max_tokens=3)
    assert [c.text for c in out.choices] == [
        complete(client, prompt=p, max_tokens=3).choices[0].text for p in prompts]
    assert out.usage is not None and out.usage.prompt_tokens == 8


def test_seeds(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        return complete(client, temperature=1.0, seed=seed, max_tokens=12).choices[0].text

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    out = complete(client, temperature=1.0, seed=1, max_tokens=12, n=3)
    texts = [c.text for c in out.choices]
    assert texts[0] == sample(1) and len(set(texts)) == 3  # choice i is seeded seed + i


def test_stop_string_cuts_text(client: openai.OpenAI) -> None:
    free = complete(client, max_tokens=16).choices[0].text
    assert len(free) > 8
    stop = free[4:7]
    cut = complete(client, max_tokens=16, stop=[stop, "never-appears"]).choices[0]
    assert cut.text == free[: free.index(stop)]
    assert cut.finish_reason == "stop"
    kept = complete(client, max_tokens=16, stop=stop,
                    extra_body={"include_stop_str_in_output": True}).choices[0]
    assert kept.text == free[: free.index(stop) + len(stop)]


def test_streamed_equals_whole(client: openai.OpenAI) -> None:
    whole = complete(client, max_tokens=12, n=2, seed=3, temperature=1.0)
    stream = complete(client, max_tokens=12, n=2, seed=3, temperature=1.0, stream=True,
                      stream_options={"include_usage": True})
    texts = ["", ""]
    finish: list[str | None] = [None, None]
    chunks = list(stream)
    for chunk in chunks[:-1]:
        assert chunk.usage is None
        [c] = chunk.choices
        texts[c.index] += c.text
        if c.finish_reason is not None:
            finish[c.index] = c.finish_reason
    assert texts == [c.text for c in whole.choices]
    assert finish == ["length", "length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage == whole.usage


def test_streamed_stop_string(client: openai.OpenAI) -> None:
    free = complete(client, max_tokens=16).choices[0].text
    stop = free[5:8]
    text = "".join(c.choices[0].text for c in complete(client, max_tokens=16, stop=stop,
                                                       stream=True) if c.choices)
    assert text == free[: free.index(stop)]


def test_logprobs(client: openai.OpenAI) -> None:
    out = complete(client, max_tokens=6, logprobs=3)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == out.choices[0].text
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0 and token in top and 3 <= len(top) <= 4
        assert math.isclose(max(top.values()), logprob, abs_tol=1e-4)  # greedy: the best one
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert complete(client, max_tokens=2).choices[0].logprobs is None


def test_echo_prepends_prompt(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    plain = complete(client, max_tokens=4).choices[0].text
    assert complete(client, max_tokens=4, echo=True).choices[0].text == PROMPT + plain
    ids = tokenizer.encode(PROMPT)
    assert complete(client, prompt=ids, max_tokens=4, echo=True).choices[0].text \
        == PROMPT + plain


@pytest.mark.parametrize("extra", [
    {"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2},
    {"min_tokens": 4, "stop_token_ids": [0], "skip_special_tokens": False, "priority": 0},
])
def test_vllm_extras_accepted(client: openai.OpenAI, extra: dict) -> None:
    out = complete(client, max_tokens=4, temperature=0.8, seed=0, presence_penalty=0.5,
                   frequency_penalty=0.5, extra_body=extra)
    assert out.choices[0].finish_reason in ("stop", "length")


def test_eos_ends_with_stop(server: LiveServer) -> None:
    """Stop on the first token (token 0 as a stop id under greedy) gives finish_reason stop
    and no text."""
    client = server.client()
    first = complete(client, max_tokens=1, logprobs=0,
                     extra_body={"return_tokens_as_token_ids": True}).choices[0].logprobs
    assert first is not None and first.tokens and first.tokens[0].startswith("token_id:")
    token_id = int(first.tokens[0].removeprefix("token_id:"))
    out = complete(client, max_tokens=5, extra_body={"stop_token_ids": [token_id]})
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == ""
    assert out.usage is not None and out.usage.completion_tokens == 0
