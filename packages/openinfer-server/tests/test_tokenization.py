"""vLLM's POST /tokenize, POST /detokenize and GET /tokenizer_info."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from live_server import ALIAS, API_KEY, MODEL, LiveServer, error_of

from openinfer_core.text.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."}]
NO_THINK = {"enable_thinking": False}


def post(server: LiveServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def tokenize(server: LiveServer, **body: Any) -> dict[str, Any]:
    response = post(server, "/tokenize", body)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    assert set(out) == {"count", "max_model_len", "tokens", "token_strs"}
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] == 512
    return out


def test_tokenize_a_prompt(server: LiveServer, tokenizer: Tokenizer) -> None:
    out = tokenize(server, model=MODEL, prompt="Hello world")
    assert out["tokens"] == tokenizer.encode("Hello world") and out["token_strs"] is None
    named = tokenize(server, model=ALIAS, prompt="Hello world", return_token_strs=True)
    assert named["tokens"] == out["tokens"] and named["token_strs"] == ["Hello", "Ġworld"]
    assert tokenize(server, prompt="")["tokens"] == []  # no model: the served one


def test_tokenize_add_special_tokens_is_passed_on(server: LiveServer) -> None:
    # Qwen's tokenizer adds no BOS, so special tokens written in the text show the flag
    # reaching the tokenizer only through equal results; both spellings are accepted.
    text = "<|im_start|>user"
    with_special = tokenize(server, prompt=text, add_special_tokens=True)
    without = tokenize(server, prompt=text, add_special_tokens=False)
    assert with_special["tokens"] == without["tokens"] == [151644, 872]


def test_tokenize_chat_matches_what_chat_completions_feeds_the_model(
        server: LiveServer, client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    out = tokenize(server, model=MODEL, messages=MESSAGES, chat_template_kwargs=NO_THINK)
    prompt = tokenizer.apply_chat_template(MESSAGES, enable_thinking=False)
    assert out["tokens"] == tokenizer.encode(prompt, add_special_tokens=False)
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=1,  # type: ignore[arg-type]
        extra_body={"chat_template_kwargs": NO_THINK})
    assert reply.usage is not None and reply.usage.prompt_tokens == out["count"]


def test_tokenize_chat_options(server: LiveServer, tokenizer: Tokenizer) -> None:
    with_prompt = tokenize(server, messages=MESSAGES, return_token_strs=True)
    bare = tokenize(server, messages=MESSAGES, add_generation_prompt=False)
    assert with_prompt["tokens"][:bare["count"]] == bare["tokens"]
    assert with_prompt["token_strs"][-3:] == ["<|im_start|>", "assistant", "Ċ"]
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    with_tools = tokenize(server, messages=MESSAGES, tools=[tool])
    assert "get_weather" in tokenizer.decode(with_tools["tokens"])


@pytest.mark.parametrize(("path", "body", "status", "param", "needle"), [
    ("/tokenize", {"model": "nope", "prompt": "hi"}, 404, "model", "does not exist"),
    ("/tokenize", {"model": "nope", "messages": MESSAGES}, 404, "model", "does not exist"),
    ("/tokenize", {"model": MODEL}, 400, "prompt", "Field required"),
    ("/tokenize", {"prompt": 5}, 400, "prompt", "valid string"),
    ("/tokenize", {"messages": []}, 400, "messages", "at least 1"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, 400,
     "continue_final_message", "add_generation_prompt"),
    ("/tokenize", {"messages": MESSAGES, "chat_template_kwargs": {"tools": []}}, 400,
     "chat_template_kwargs", "must not set tools"),
    ("/detokenize", {"model": "nope", "tokens": [1]}, 404, "model", "does not exist"),
    ("/detokenize", {"tokens": [9_999_999]}, 400, "tokens", "outside the vocabulary"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens", "outside the vocabulary"),
    ("/detokenize", {"tokens": ["a"]}, 400, "tokens", "valid integer"),
    ("/detokenize", {}, 400, "tokens", "Field required"),
])
def test_tokenize_errors(server: LiveServer, path: str, body: dict[str, Any], status: int,
                         param: str, needle: str) -> None:
    err = error_of(post(server, path, body), status)
    assert err["param"] == param and needle in err["message"], err
    if status == 404:
        assert err["code"] == "model_not_found"


def test_detokenize_round_trips(server: LiveServer, tokenizer: Tokenizer) -> None:
    text = "<|im_start|>user\nHéllo, wörld! 你好<|im_end|>"
    ids = tokenize(server, prompt=text)["tokens"]
    response = post(server, "/detokenize", {"model": MODEL, "tokens": ids})
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": text}
    assert post(server, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


def test_tokenizer_info(server: LiveServer, keyed_server: LiveServer,
                        tokenizer: Tokenizer) -> None:
    """vLLM's shape (the tokenizer config, added tokens as text, no file paths), with what
    lm-eval's remote tokenizer reads: the special tokens and the chat template."""
    response = httpx.get(f"{server.url}/tokenizer_info", timeout=30)
    assert response.status_code == 200, response.text
    info = response.json()
    assert info["eos_token"] == "<|im_end|>" and info["pad_token"] == "<|endoftext|>"
    assert info["bos_token"] is None  # Qwen has none
    assert tokenizer.chat_template is not None
    assert info["chat_template"] == tokenizer.chat_template.source
    assert info["tokenizer_class"] == "Qwen2Tokenizer"
    assert info["model_max_length"] == 131072  # the tokenizer's; the server takes fewer:
    assert info["max_model_len"] == 512 and info["vocab_size"] == tokenizer.vocab_size
    assert info["added_tokens_decoder"]["151645"] == "<|im_end|>"
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & info.keys()
    # the ids lm-eval derives: each special token tokenizes to itself
    [eos_id] = tokenize(server, prompt=info["eos_token"], add_special_tokens=False)["tokens"]
    assert eos_id == 151645
    # behind an API key like every route but /health; the served length is the app's own
    assert httpx.get(f"{keyed_server.url}/tokenizer_info", timeout=30).status_code == 401
    keyed = httpx.get(f"{keyed_server.url}/tokenizer_info", timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert keyed["max_model_len"] == 128
