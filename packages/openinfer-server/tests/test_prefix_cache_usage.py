"""The prefix cache as clients see it: `usage.prompt_tokens_details.cached_tokens` on a repeated
prompt (plain and streamed) and the engine counters on /metrics."""

from __future__ import annotations

import httpx
import openai
from live_server import MODEL, LiveServer
from prometheus_client.parser import text_string_to_metric_families

# 40 token ids no other test sends: with 16-token blocks a repeat reuses 2 full blocks.
PROMPT = [4200 + 3 * i for i in range(40)]
COUNTERS = ("openinfer:prefix_cache_queries_total", "openinfer:prefix_cache_hits_total",
            "openinfer:num_preemptions_total")


def _counters(server: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name in COUNTERS and s.labels == {"model_name": MODEL}}


def test_repeated_prompt_reports_cached_tokens_and_moves_counters(
        server: LiveServer, client: openai.OpenAI) -> None:
    server.wait_idle()
    before = _counters(server)
    assert set(before) == set(COUNTERS)
    args = {"model": MODEL, "max_tokens": 3, "temperature": 0.0,
            "extra_body": {"ignore_eos": True}}
    first = client.completions.create(prompt=PROMPT, **args)  # type: ignore[call-overload]
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(prompt=PROMPT, **args)  # type: ignore[call-overload]
    assert again.usage.prompt_tokens == 40
    assert again.usage.prompt_tokens_details.cached_tokens == 32
    assert again.choices[0].text == first.choices[0].text

    stream = client.completions.create(prompt=PROMPT, stream=True,  # type: ignore[call-overload]
                                       stream_options={"include_usage": True}, **args)
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens_details.cached_tokens == 32

    server.wait_idle()
    after = _counters(server)
    assert after["openinfer:prefix_cache_queries_total"] \
        - before["openinfer:prefix_cache_queries_total"] == 3 * 40
    assert after["openinfer:prefix_cache_hits_total"] \
        - before["openinfer:prefix_cache_hits_total"] == 2 * 32
    assert after["openinfer:num_preemptions_total"] == before["openinfer:num_preemptions_total"]
