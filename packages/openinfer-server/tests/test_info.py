"""/v1/models, /health, /version and /metrics."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from fastapi import FastAPI
from live_server import ALIAS, API_KEY, MODEL, LiveServer
from prometheus_client.parser import text_string_to_metric_families

from openinfer_core.handle import EngineHandle
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app


def test_models_lists_served_names(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL, ALIAS]
    card = models[0].model_dump()
    assert card["object"] == "model" and card["owned_by"] == "openinfer"
    assert card["max_model_len"] == 512


def test_retrieve_a_model(client: openai.OpenAI, server: LiveServer) -> None:
    listed = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
    for name in (MODEL, ALIAS):
        assert client.models.retrieve(name).id == name
        assert httpx.get(f"{server.url}/v1/models/{name}").json() == listed[name]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4")
    assert info.value.status_code == 404
    response = httpx.get(f"{server.url}/v1/models/gpt-4")
    assert response.json() == {"error": {
        "message": "The model `gpt-4` does not exist. This server serves 'tiny-qwen3', "
                   "'tiny-alias'.",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}}


def test_retrieve_a_model_whose_name_has_slashes(engine: EngineHandle,
                                                 tokenizer: Tokenizer) -> None:
    app = build_app(engine, tokenizer, served_model_names=["Qwen/Qwen3-8B", "org/team/m"])
    for name in ("Qwen/Qwen3-8B", "org/team/m"):
        response = asyncio.run(_asgi_get(app, f"/v1/models/{name}"))
        assert response.status_code == 200 and response.json()["id"] == name
    for path in ("/v1/models/Qwen", "/v1/models/Qwen/Qwen3-8B/extra", "/v1/models/"):
        response = asyncio.run(_asgi_get(app, path))
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "model_not_found"


def test_health_and_version(server: LiveServer) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    version = httpx.get(f"{server.url}/version").json()["version"]
    assert version and version[0].isdigit()


async def _asgi_get(app: FastAPI, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        return await c.get(path)


def test_demo_model_is_labelled(engine: EngineHandle, tokenizer: Tokenizer) -> None:
    app = build_app(engine, tokenizer, served_model_names=["openinfer-demo"], is_demo=True)
    card = asyncio.run(_asgi_get(app, "/v1/models")).json()["data"][0]
    assert card["id"] == "openinfer-demo" and card["owned_by"] == "openinfer-demo"
    assert card["metadata"]["demo"] is True and "random" in card["metadata"]["description"]


def test_build_app_checks_its_arguments(engine: EngineHandle, tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="served_model_names"):
        build_app(engine, tokenizer, served_model_names=[])
    with pytest.raises(ValueError, match="max_model_len"):
        build_app(engine, tokenizer, served_model_names=["m"], max_model_len=100_000)


def _samples(server: LiveServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"model_name": MODEL, **labels}.items())))
    return float(samples.get(key, 0.0))


def test_metrics_parse_and_move(server: LiveServer, client: openai.OpenAI) -> None:
    server.wait_idle()
    before = _samples(server)
    for name in ("openinfer:num_requests_running", "openinfer:num_requests_waiting",
                 "openinfer:kv_cache_usage_perc"):
        assert _value(before, name) == 0.0
    out = client.completions.create(model=MODEL, prompt=["one", "two three"], max_tokens=5,
                                    temperature=0, extra_body={"ignore_eos": True})
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_body={"ignore_eos": True})
    assert out.usage is not None
    after = _samples(server)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("openinfer:request_success_total", finished_reason="length") == 3
    assert moved("openinfer:generation_tokens_total") == 5 + 5 + 3
    assert moved("openinfer:prompt_tokens_total") >= out.usage.prompt_tokens + 1
    assert moved("openinfer:time_to_first_token_seconds_count") == 3
    assert moved("openinfer:e2e_request_latency_seconds_count") == 3
    assert moved("openinfer:inter_token_latency_seconds_count") == 4 + 4 + 2
    # One intake a request (the completion's two prompts are one request), each shorter than
    # the request's whole time at the frontend, which it precedes.
    assert moved("openinfer:request_intake_seconds_count") == 2
    assert 0 < moved("openinfer:request_intake_seconds_sum") < moved(
        "openinfer:e2e_request_latency_seconds_sum")
    assert moved("openinfer:prefix_cache_queries_total") >= moved("openinfer:prompt_tokens_total")


def test_two_apps_keep_separate_counters(server: LiveServer, keyed_server: LiveServer) -> None:
    """Both apps share one engine and one process; only the one that served counts."""
    before = _value(_samples(keyed_server), "openinfer:generation_tokens_total")
    httpx.post(f"{server.url}/v1/completions",
               json={"prompt": "count me", "max_tokens": 2, "ignore_eos": True})
    assert _value(_samples(keyed_server), "openinfer:generation_tokens_total") == before
