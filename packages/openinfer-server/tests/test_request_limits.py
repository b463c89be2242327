"""--max-request-bytes (413 before the body is parsed) and the character bound on prompts (400
before tokenizing): a prompt with more characters than max_model_len tokens can stand for."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import tokenizers
from live_server import MODEL, LiveServer, error_of, serve_in_thread
from tokenizers import models, normalizers, pre_tokenizers

from openinfer_core.handle import EngineHandle
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app
from openinfer_server.body_limit import DEFAULT_MAX_REQUEST_BYTES
from openinfer_server.cli import build_parser
from openinfer_server.prompt_limit import chars_per_token

LIMIT = 4096


@pytest.fixture(scope="module")
def small_server(engine: EngineHandle, tokenizer: Tokenizer) -> Iterator[LiveServer]:
    """Accepts bodies of LIMIT bytes at most."""
    app = build_app(engine, tokenizer, served_model_names=[MODEL], max_request_bytes=LIMIT)
    url, server, thread = serve_in_thread(app)
    yield LiveServer(url, app, engine, tokenizer)
    server.should_exit = True
    thread.join(timeout=10)


def _completion(prompt_chars: int) -> bytes:
    return (b'{"prompt": "' + b"x" * prompt_chars + b'", "max_tokens": 1}')


def _chunks(body: bytes, size: int = 1000) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i:i + size]


def test_the_default_limit_is_32_mib() -> None:
    assert DEFAULT_MAX_REQUEST_BYTES == 32 * 2**20
    assert build_parser().parse_args(["serve"]).max_request_bytes == 32 * 2**20
    assert build_parser().parse_args(
        ["serve", "--max-request-bytes", "1000"]).max_request_bytes == 1000


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_body_over_the_limit_is_413(small_server: LiveServer, path: str) -> None:
    headers = {"Content-Type": "application/json"}
    body = _completion(LIMIT)  # the quotes and fields take it past LIMIT
    declared = httpx.post(f"{small_server.url}{path}", content=body, headers=headers)
    err = error_of(declared, 413)
    assert err["code"] == "request_too_large" and f"({len(body)} bytes)" in err["message"]
    assert "--max-request-bytes" in err["message"]
    chunked = httpx.post(f"{small_server.url}{path}", content=_chunks(body), headers=headers)
    assert "transfer-encoding" not in declared.request.headers
    assert chunked.request.headers["transfer-encoding"] == "chunked"
    assert error_of(chunked, 413)["code"] == "request_too_large"


def test_a_body_within_the_limit_passes_declared_or_chunked(small_server: LiveServer) -> None:
    body = _completion(LIMIT - 100)
    assert len(body) <= LIMIT
    headers = {"Content-Type": "application/json"}
    for content in (body, _chunks(body)):
        response = httpx.post(f"{small_server.url}/v1/completions", content=content,
                              headers=headers, timeout=30)
        assert response.status_code == 200, response.text
    assert httpx.get(f"{small_server.url}/health").status_code == 200


def test_qwen_tokens_stand_for_at_most_512_characters(tokenizer: Tokenizer) -> None:
    # The longest entry is 128 byte-level characters; NFC lets one character stand for 4.
    assert max(map(len, tokenizer.backend.get_vocab(with_added_tokens=True))) == 128
    assert chars_per_token(tokenizer) == 128 * 4


def _tokenizer(model: models.Model, **parts: object) -> Tokenizer:
    backend = tokenizers.Tokenizer(model)
    for name, part in parts.items():
        setattr(backend, name, part)
    return Tokenizer(backend)


VOCAB = {"[UNK]": 0, "a": 1, "ab": 2, "abcdef": 3}


@pytest.mark.parametrize(("tokenizer_parts", "bound"), [
    ({"model": models.BPE(VOCAB, [], unk_token="[UNK]")}, 6),
    ({"model": models.BPE(VOCAB, [], byte_fallback=True),
      "normalizer": normalizers.NFKC()}, 6 * 18),
    ({"model": models.BPE(VOCAB, [], unk_token="[UNK]"),
      "normalizer": normalizers.Replace("xyz", "q")}, 6 * 3),
    # An unknown run fused into one token, dropped unknown characters, dropped whitespace,
    # stripped text, an unknown word: no bound holds.
    ({"model": models.BPE(VOCAB, [], unk_token="[UNK]", fuse_unk=True)}, None),
    ({"model": models.BPE(VOCAB, [])}, None),
    ({"model": models.BPE(VOCAB, [], unk_token="[UNK]"),
      "pre_tokenizer": pre_tokenizers.Whitespace()}, None),
    ({"model": models.BPE(VOCAB, [], unk_token="[UNK]"),
      "normalizer": normalizers.Strip()}, None),
    ({"model": models.WordPiece(VOCAB, unk_token="[UNK]")}, None),
])
def test_the_bound_is_read_from_the_tokenizer(tokenizer_parts: dict[str, object],
                                              bound: int | None) -> None:
    parts = dict(tokenizer_parts)
    model = parts.pop("model")
    assert isinstance(model, models.Model)
    assert chars_per_token(_tokenizer(model, **parts)) == bound


def test_an_added_token_that_strips_whitespace_has_no_bound() -> None:
    tok = _tokenizer(models.BPE(VOCAB, [], unk_token="[UNK]"))
    tok.backend.add_special_tokens([tokenizers.AddedToken("<mask>", lstrip=True)])
    assert chars_per_token(Tokenizer(tok.backend)) is None


TWENTY_MB = 20_000_000


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "hello world " * (TWENTY_MB // 12)}, "prompt"),
    ("/v1/completions", {"prompt": ["hi", "hello world " * (TWENTY_MB // 12)]}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user",
                                            "content": "hello world " * (TWENTY_MB // 12)}]},
     "messages"),
    ("/tokenize", {"prompt": "hello world " * (TWENTY_MB // 12)}, "prompt"),
])
def test_a_prompt_no_tokenization_can_fit_is_refused_before_tokenizing(
        server: LiveServer, path: str, body: dict[str, object], param: str) -> None:
    started = time.monotonic()
    err = error_of(httpx.post(f"{server.url}{path}", json=body, timeout=60), 400)
    elapsed = time.monotonic() - started
    assert err["code"] == "context_length_exceeded" and err["param"] == param
    assert "maximum context length is 512 tokens" in err["message"]
    assert f"more than the {512 * 512} that 512 tokens can hold" in err["message"]
    # Tokenizing 20 MB takes 15-20 s here; refusing it, under a second or two on a loaded
    # machine (sending and parsing the body).
    assert elapsed < 5, elapsed


def test_a_prompt_within_the_bound_is_counted_in_tokens(server: LiveServer,
                                                        tokenizer: Tokenizer) -> None:
    text = "hello world " * (512 * 512 // 12)  # within the character bound, 2 tokens a 12
    err = error_of(httpx.post(f"{server.url}/v1/completions",
                              json={"prompt": text, "max_tokens": 1}, timeout=60), 400)
    count = len(tokenizer.encode(text))
    assert f"({count} in the prompt, 1 in the completion)" in err["message"]
    assert err["code"] == "context_length_exceeded"
    counted = httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=60).json()
    assert counted["count"] == count > 512  # /tokenize counts past the context, as vLLM's
