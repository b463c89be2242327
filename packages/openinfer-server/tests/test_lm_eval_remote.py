"""lm-eval's `local-completions` model with `tokenizer_backend=remote`, unmodified, against
the live server: its RemoteTokenizer reads GET /tokenizer_info and tokenizes through
/tokenize and /detokenize, then it scores and generates over /v1/completions. Its numbers
must be the server's own (the server's against transformers: tests/test_prompt_logprobs.py)."""

from __future__ import annotations

import math

import openai
import pytest
from live_server import MODEL, LiveServer
from lm_eval.api.instance import Instance
from lm_eval.models.openai_completions import LocalCompletionsAPI
from lm_eval.utils import RemoteTokenizer

from openinfer_core.text.tokenizer import Tokenizer

PAIRS = [("The capital of France is", " Paris"), ("One, two,", " three, four")]


@pytest.fixture(scope="module")
def lm(server: LiveServer) -> LocalCompletionsAPI:
    return LocalCompletionsAPI(model=MODEL, base_url=f"{server.url}/v1/completions",
                               tokenizer_backend="remote", max_length=512, max_retries=1)


def test_remote_tokenizer_is_the_servers(lm: LocalCompletionsAPI, tokenizer: Tokenizer,
                                         server: LiveServer) -> None:
    assert isinstance(lm.tokenizer, RemoteTokenizer)
    assert lm.eot_token_id == 151645 and lm.eos_string == "<|im_end|>"
    assert lm.prefix_token_id == 151645  # Qwen has no BOS: lm-eval falls back to the EOS
    text = "Héllo, wörld! 你好"
    assert lm.tok_encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert lm.decode_batch([lm.tok_encode(text)]) == [text]
    chat = [{"role": "user", "content": "Hi"}]
    assert tokenizer.chat_template is not None
    assert lm.tokenizer.tokenizer_info["chat_template"] == tokenizer.chat_template.source
    # lm-eval renders it in its own jinja environment, strictly (an unset variable raises:
    # Qwen's template reads `tools`) and keeping the template's trailing newline.
    rendered = lm.tokenizer.apply_chat_template(chat, tools=None)
    assert rendered.rstrip("\n") == tokenizer.apply_chat_template(chat).rstrip("\n")
    # tokenizer_backend="auto" (the default) finds the remote tokenizer by itself
    auto = LocalCompletionsAPI(model=MODEL, base_url=f"{server.url}/v1/completions")
    assert isinstance(auto.tokenizer, RemoteTokenizer)


def test_loglikelihood_is_the_servers(lm: LocalCompletionsAPI, server: LiveServer,
                                      tokenizer: Tokenizer) -> None:
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(PAIRS)]
    scores = lm.loglikelihood(requests, disable_tqdm=True)
    client: openai.OpenAI = server.client()
    for (context, continuation), (logprob, _) in zip(PAIRS, scores, strict=True):
        context_ids = tokenizer.encode(context, add_special_tokens=False)
        whole = tokenizer.encode(context + continuation, add_special_tokens=False)
        # lm-eval sends context + continuation ids as one prompt (no prefix token unless
        # the context is empty) and sums the continuation's echoed logprobs.
        out = client.completions.create(model=MODEL, prompt=whole, echo=True, logprobs=1,
                                        max_tokens=0, temperature=0.0)
        assert out.choices[0].logprobs is not None
        token_logprobs = out.choices[0].logprobs.token_logprobs or []
        assert len(token_logprobs) == len(whole) > len(context_ids)
        expected = sum(token_logprobs[len(context_ids):])
        assert math.isfinite(logprob) and logprob == pytest.approx(expected, abs=1e-5)


def test_generate_until_is_the_servers(lm: LocalCompletionsAPI, server: LiveServer) -> None:
    request = Instance("generate_until", {}, ("Once upon a time", {"until": ["\n\n"],
                                                                   "max_gen_toks": 6}), 0)
    [text] = lm.generate_until([request], disable_tqdm=True)
    direct = server.client().completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0.0, seed=1234,
        stop=["\n\n", "<|im_end|>"])
    assert text == direct.choices[0].text and text
