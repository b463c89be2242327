"""A KV cache too small for one `max_model_len` sequence: left to the model, `max_model_len` is
lowered to what the cache holds, with a warning naming both, and the API serves that length
(a chat request without max_tokens runs); set by the user, the start is refused with what to
change."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from engine_helpers import run_staggered, tokens_of
from starlette.testclient import TestClient

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.errors import ModelConfigError
from openinfer_core.events import Finished, FinishReason
from openinfer_core.ipc import EngineClient, EngineProcess
from openinfer_core.params import SamplingParams
from openinfer_core.request import GenerateRequest
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app

MODEL_LEN = 512  # the tiny checkpoint's max_position_embeddings
TINY_POOL = 5  # blocks, padding included: 4 of 16 tokens = 64 tokens


def test_a_length_left_to_the_model_is_lowered_to_the_pool(
        qwen3_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="openinfer"):
        engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu",
                                     num_kv_blocks=TINY_POOL))
    (warning,) = [r.getMessage() for r in caplog.records if "max_model_len" in r.getMessage()]
    assert warning.startswith(f"max_model_len lowered from {MODEL_LEN} (the model's) to 64 "
                              "tokens: the KV cache holds 4 blocks of 16 tokens"), warning
    assert "--num-kv-blocks 33 or more, now 5" in warning
    assert engine.model_info.max_model_len == engine.model.max_model_len == 64
    # What the API asks for a request without max_tokens: all the room the prompt leaves.
    prompt = tuple(range(1, 11))
    request = GenerateRequest("all-the-room", prompt, SamplingParams(
        max_tokens=64 - len(prompt), temperature=0.0, ignore_eos=True))
    events = run_staggered(engine, [request], lambda i: 0)["all-the-room"]
    end = events[-1]
    assert isinstance(end, Finished) and end.reason is FinishReason.LENGTH, events
    assert len(tokens_of(events)) == 54 and engine.kv.num_used_blocks == 0


@pytest.mark.parametrize("pool", ["num_kv_blocks", "cpu_kv_cache_gib"])
def test_a_length_the_user_set_that_the_pool_cannot_hold_is_refused(
        qwen3_dir: Path, pool: str) -> None:
    probe = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", num_kv_blocks=2))
    block_bytes = probe.model.kv_bytes_per_block(16)
    sized = ({"num_kv_blocks": TINY_POOL} if pool == "num_kv_blocks" else
             {"cpu_kv_cache_gib": TINY_POOL * block_bytes / (1 << 30)})
    with pytest.raises(ModelConfigError) as raised:
        Engine(EngineConfig(model=str(qwen3_dir), device="cpu", max_model_len=128,
                            **sized))  # type: ignore[arg-type]
    message = str(raised.value)
    assert message.startswith(
        "max_model_len 128 does not fit the KV cache: one sequence of 128 tokens needs 8 "
        "blocks of 16 tokens, the cache holds 4 (64 tokens). Lower --max-model-len to 64 or "
        "less, or give the KV cache more memory ("), message
    assert ("--num-kv-blocks 9 or more, now 5" if pool == "num_kv_blocks"
            else "EngineConfig.cpu_kv_cache_gib above") in message
    fits = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", max_model_len=64,
                               **sized))  # type: ignore[arg-type]
    assert fits.model_info.max_model_len == 64


def test_the_api_serves_the_lowered_length(qwen3_dir: Path) -> None:
    """The engine in its own process, as under `openinfer serve`: the frontend learns the
    length from the engine's handshake; /v1/models shows it, and a chat request without
    max_tokens generates up to it instead of being refused."""
    process = EngineProcess.start(EngineConfig(model=str(qwen3_dir), device="cpu",
                                               num_kv_blocks=TINY_POOL), "error")
    client = EngineClient(process.addresses, sentinel=process.sentinel)
    try:
        assert client.model_info.max_model_len == 64
        app = build_app(client, Tokenizer.from_dir(qwen3_dir), served_model_names=["m"],
                        max_model_len=client.model_info.max_model_len)
        with TestClient(app) as http:
            card = http.get("/v1/models").json()["data"][0]
            assert card["max_model_len"] == 64
            reply = http.post("/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0, "ignore_eos": True})
            assert reply.status_code == 200, reply.text
            usage = reply.json()["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] == 64
            assert reply.json()["choices"][0]["finish_reason"] == "length"
    finally:
        client.close()
        process.stop()
