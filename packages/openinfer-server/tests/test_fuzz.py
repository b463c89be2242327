"""Fuzzing: whatever a client sends, no 5xx and no hang.

Schemathesis drives every operation of the app's own OpenAPI schema (valid and invalid
bodies); hypothesis strategies below add near-valid bodies that reach the engine more often;
`test_hostile_requests` sends hostile.py's requests (every body field through extreme
numbers, then random hostile bodies and GETs) and checks the engine is unchanged after them.
Generated bodies keep max_tokens and n small (in the test, never by the server) so each
example costs milliseconds on CPU."""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import hostile
import httpx
import pytest
import schemathesis
from hostile import HostileRequest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_server import MODEL, LiveServer
from schemathesis.checks import not_a_server_error

SMALL = 6  # most tokens a fuzzed request may ask for
FUZZ = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
TIMEOUT = 30.0  # a request slower than this counts as a hang


def _keep_small(body: Any) -> Any:
    """Shrink what would make an example slow; leave everything else as generated."""
    if not isinstance(body, dict):
        return body
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > SMALL:
            body[key] = 1 + value % SMALL
    if "messages" in body and body.get("max_tokens") is None \
            and body.get("max_completion_tokens") is None:
        body["max_tokens"] = SMALL  # chat's default is "the rest of the context"
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and 3 < n <= 128:
        body["n"] = 1 + n % 3
    return body


@pytest.fixture(scope="session")
def api_schema(server: LiveServer) -> Any:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")

    @schema.hook
    def map_body(context: Any, body: Any) -> Any:
        return _keep_small(body)

    return schema


# Every operation the app declares (schemathesis' own pytest plugin does not run under the
# pytest this workspace uses, so its strategies are driven by hypothesis directly).
OPERATIONS = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
              ("GET", "/v1/models"), ("GET", "/v1/models/{model_id}"), ("GET", "/health"),
              ("GET", "/version"), ("GET", "/metrics"), ("POST", "/tokenize"),
              ("POST", "/detokenize"), ("POST", "/v1/embeddings"), ("POST", "/v1/responses"),
              ("GET", "/v1/responses/{response_id}"), ("DELETE", "/v1/responses/{response_id}"),
              ("GET", "/tokenizer_info")]


def test_schema_declares_these_operations(api_schema: Any) -> None:
    declared = {(op.ok().method.upper(), op.ok().path)
                for op in api_schema.get_all_operations()}
    assert declared == set(OPERATIONS)


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_schema_fuzz(api_schema: Any, method: str, path: str) -> None:
    operation = api_schema[path][method]

    @FUZZ
    @given(case=operation.as_strategy())
    def check(case: Any) -> None:
        response = case.call(timeout=TIMEOUT)
        case.validate_response(response, checks=[not_a_server_error])

    check()


# -- near-valid bodies ---------------------------------------------------------------------

def _mostly(valid: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` nine times in ten, so most bodies reach the engine; `odd` otherwise."""
    # Hypothesis leans towards small integers; 9, not 0, picks the odd branch.
    return st.integers(0, 9).flatmap(lambda k: odd if k == 9 else valid)


_text = _mostly(st.text(min_size=1, max_size=40), st.just(""))
_odd_number = st.one_of(st.none(), st.integers(-3, 300), st.floats(allow_nan=True,
                                                                   allow_infinity=True))
_sampling = st.fixed_dictionaries({}, optional={
    "model": _mostly(st.sampled_from([MODEL, "tiny-alias"]), st.sampled_from(["other", ""])),
    "n": _mostly(st.integers(1, 3), st.integers(-1, 0)),
    "max_tokens": _mostly(st.integers(1, SMALL), st.sampled_from([None, 0, -2, 10**9])),
    "temperature": _mostly(st.floats(0, 2), _odd_number),
    "top_p": _mostly(st.floats(0.01, 1), _odd_number),
    "top_k": _mostly(st.integers(-1, 50), st.integers(-5, -2)),
    "min_p": _mostly(st.floats(0, 1), _odd_number),
    "seed": _mostly(st.integers(0, 2**32), st.integers(-(2**64), 2**65)),
    "presence_penalty": _mostly(st.floats(-2, 2), _odd_number),
    "frequency_penalty": _mostly(st.floats(-2, 2), _odd_number),
    "repetition_penalty": _mostly(st.floats(0.5, 2), _odd_number),
    "stop": st.one_of(st.none(), _text, st.lists(_text, max_size=3)),
    "stop_token_ids": _mostly(st.lists(st.integers(0, 151000), max_size=3),
                              st.lists(st.integers(-1, 200000), max_size=3)),
    "ignore_eos": st.booleans(), "min_tokens": _mostly(st.integers(0, 1), st.integers(-1, 9)),
    "include_stop_str_in_output": st.booleans(), "skip_special_tokens": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.one_of(st.none(), st.fixed_dictionaries(
        {"include_usage": st.booleans()})),
})
_token_ids = _mostly(st.lists(st.integers(0, 151000), min_size=1, max_size=12),
                     st.lists(st.integers(-1, 160000), max_size=12))
_prompt = _mostly(st.one_of(_text, st.lists(_text, max_size=3), _token_ids,
                            st.lists(_token_ids, max_size=3)),
                  st.one_of(st.integers(), st.none(), st.lists(st.none())))
_completion = st.tuples(_sampling, st.fixed_dictionaries({"prompt": _prompt}, optional={
    "echo": st.booleans(),
    "logprobs": _mostly(st.one_of(st.none(), st.integers(0, 5)), st.integers(-1, 25)),
}))
_part = _mostly(st.fixed_dictionaries({"type": st.just("text"), "text": _text}),
                st.fixed_dictionaries({"type": _text, "text": _text}))
_message = st.fixed_dictionaries({
    "role": _mostly(st.sampled_from(["system", "user", "assistant", "tool", "developer"]),
                    st.sampled_from(["bot", "", None])),
    "content": st.one_of(st.none(), _text, st.lists(_part, max_size=2)),
})
# Chat templates insist on a user turn (Qwen3's raises without one); end with one mostly.
_user = st.fixed_dictionaries({"role": st.just("user"), "content": _text})
_messages = st.tuples(st.lists(_message, max_size=3), _mostly(st.just(True), st.just(False)),
                      _user).map(lambda t: [*t[0], t[2]] if t[1] else t[0])
_chat = st.tuples(_sampling, st.fixed_dictionaries(
    {"messages": _messages}, optional={
        "max_completion_tokens": _mostly(st.integers(1, SMALL), st.integers(-1, 0)),
        "logprobs": st.booleans(),
        "top_logprobs": _mostly(st.one_of(st.none(), st.integers(0, 5)), st.integers(-1, 25)),
        "add_generation_prompt": st.booleans(),
        "chat_template_kwargs": _mostly(
            st.one_of(st.none(), st.fixed_dictionaries({"enable_thinking": st.booleans()})),
            st.fixed_dictionaries({"messages": st.just([]), "x": _text})),
    }))


def _post(server: LiveServer, path: str, parts: tuple[dict, dict]) -> None:
    body = _keep_small({**parts[0], **parts[1]})
    content = json.dumps(body)  # NaN and Infinity included, as Python clients may send them
    headers = {"Content-Type": "application/json"}
    with httpx.Client(timeout=TIMEOUT) as client, \
            client.stream("POST", f"{server.url}{path}", content=content,
                          headers=headers) as response:
        raw = response.read()  # streams included: a hang fails on the timeout
    assert response.status_code < 500, (body, raw[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and "type" in error, raw
    elif body.get("stream") is True:
        assert raw.endswith(b"data: [DONE]\n\n")
        assert b'"error"' not in raw, raw[-500:]


@FUZZ
@given(parts=_completion)
def test_fuzz_completions(server: LiveServer, parts: tuple[dict, dict]) -> None:
    _post(server, "/v1/completions", parts)


@FUZZ
@given(parts=_chat)
def test_fuzz_chat(server: LiveServer, parts: tuple[dict, dict]) -> None:
    _post(server, "/v1/chat/completions", parts)


def test_fuzzing_left_nothing_running(server: LiveServer) -> None:
    server.wait_idle()


# -- hostile requests ----------------------------------------------------------------------

RANDOM = 1_200  # requests beyond the sweep of every field through every extreme
SEED = 35
GREEDY = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0}


def _greedy(server: LiveServer) -> str:
    r = httpx.post(f"{server.url}/v1/completions", json=GREEDY, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    text: str = r.json()["choices"][0]["text"]
    return text


def _problem(client: httpx.Client, url: str, request: HostileRequest) -> tuple[int, str | None]:
    """(status, what is wrong with the answer or None)."""
    headers = {"Content-Type": "application/json"} if request.content is not None else {}
    try:
        with client.stream(request.method, f"{url}{request.path}", content=request.content,
                           headers=headers) as response:
            raw = response.read()
    except httpx.TimeoutException:
        return 0, f"no answer within {TIMEOUT} s"
    except httpx.TransportError as exc:
        return 0, f"connection failed: {exc!r}"
    status = response.status_code
    if status >= 500:
        return status, raw[:300].decode(errors="replace")
    if status >= 400 and request.method != "HEAD":
        error = json.loads(raw).get("error", {})
        if not (error.get("message") and error.get("type")):
            return status, f"not an OpenAI error body: {raw[:300]!r}"
    if status == 200 and request.streams:
        # A Responses stream ends with its response.completed event, without [DONE] (OpenAI's).
        last_event = raw.rstrip(b"\n").rpartition(b"\n\n")[2]
        ended = (last_event.startswith(b"event: response.completed\n")
                 if request.path == "/v1/responses" else raw.endswith(b"data: [DONE]\n\n"))
        if not ended:
            return status, f"stream cut short: {raw[-300:]!r}"
        if b'"server_error"' in raw:
            return status, f"stream failed: {raw[-300:]!r}"
    return status, None


def test_hostile_requests(server: LiveServer) -> None:
    """Thousands of hostile requests over every route: none gets a 5xx or hangs, and the
    engine serves a greedy request exactly as before them."""
    before = _greedy(server)
    local = threading.local()

    def send(request: HostileRequest) -> tuple[int, str | None]:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=TIMEOUT)
        return _problem(local.client, server.url, request)

    cases = hostile.requests(SEED, server.tokenizer.vocab_size, extra=RANDOM)
    assert len(cases) >= 2_000
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, cases))
    failures = [(i, c.method, c.path, c.content[:200] if c.content else None, problem)
                for i, (c, (_, problem)) in enumerate(zip(cases, results, strict=True))
                if problem is not None]
    assert not failures, f"{len(failures)} of {len(cases)} failed (index, ...): {failures[:5]}"
    statuses = Counter(status for status, _ in results)
    served = sum(1 for c, (status, _) in zip(cases, results, strict=True)
                 if status == 200 and c.path.startswith("/v1/") and c.method == "POST")
    assert served >= RANDOM // 20, (served, statuses)  # enough of them reached the engine
    server.wait_idle()
    assert _greedy(server) == before
