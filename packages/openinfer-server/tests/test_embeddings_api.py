"""/v1/embeddings through openai-python against transformers' base Qwen3Model (fp32 on CPU):
the engine process (task detected from modules.json) behind IPC, float and base64 encodings,
Matryoshka dimensions, a batch of mixed lengths with one input longer than the step budget
(chunked prefill), no KV kept after, and the 400s (including the task mismatch both ways)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F
from live_server import MODEL, LiveServer, serve_in_thread
from qwen3_checkpoints import SPECS, hf_embedding, write_embedding_checkpoint

from openinfer_core.engine.config import EngineConfig
from openinfer_core.ipc import EngineClient, EngineProcess
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app

SPEC = SPECS["gqa-tied"]
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def embed_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_embedding_checkpoint(SPEC, tmp_path_factory.mktemp("embed") / "qwen3-embed")


@pytest.fixture(scope="module")
def embed_server(embed_checkpoint: Path) -> Iterator[LiveServer]:
    path = embed_checkpoint
    process = EngineProcess.start(EngineConfig(
        model=str(path), device="cpu", max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=32),
        "warning")
    client = EngineClient(process.addresses, sentinel=process.sentinel)
    tokenizer = Tokenizer.from_dir(path)
    app = build_app(client, tokenizer, served_model_names=[MODEL])
    url, server, thread = serve_in_thread(app)
    yield LiveServer(url, app, client, tokenizer)
    server.should_exit = True
    thread.join(timeout=10)
    client.close()
    process.stop()


def test_batch_of_mixed_inputs_matches_transformers(embed_server: LiveServer,
                                                   embed_checkpoint: Path) -> None:
    assert embed_server.engine.model_info.task == "embed"  # detected from modules.json
    client = embed_server.client()
    texts = ["Hello world", "What is the capital of France? " * 8]  # the second is chunked
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    out = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in out.data] == [0, 1] and out.model == MODEL
    encoded = [embed_server.tokenizer.encode(t, add_special_tokens=True) for t in texts]
    assert len(encoded[1]) > 32  # longer than max_num_batched_tokens: several prefill steps
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(map(len, encoded))
    for d, e in zip(out.data, encoded, strict=True):
        assert len(d.embedding) == SPEC.hidden_size
        torch.testing.assert_close(torch.tensor(d.embedding), hf_embedding(embed_checkpoint, e),
                                   atol=1e-5, rtol=0)
    single = client.embeddings.create(model=MODEL, input=ids)
    torch.testing.assert_close(torch.tensor(single.data[0].embedding),
                               hf_embedding(embed_checkpoint, ids), atol=1e-5, rtol=0)
    several = client.embeddings.create(model=MODEL, input=[ids, ids[:3]])
    assert several.data[0].embedding == single.data[0].embedding
    embed_server.wait_idle()  # every block given back


def test_base64_and_dimensions(embed_server: LiveServer) -> None:
    client = embed_server.client()
    floats = client.embeddings.create(model=MODEL, input="a b c", encoding_format="float")
    # openai-python decodes base64 itself when it asked for it; the raw body is checked too.
    raw = httpx.post(f"{embed_server.url}/v1/embeddings",
                     json={"input": "a b c", "encoding_format": "base64", "user": "u1"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    assert decoded.tolist() == floats.data[0].embedding
    short = client.embeddings.create(model=MODEL, input="a b c", dimensions=8)
    expect = F.normalize(torch.tensor(floats.data[0].embedding[:8]), dim=-1)
    torch.testing.assert_close(torch.tensor(short.data[0].embedding), expect, atol=1e-6,
                               rtol=0)


@pytest.mark.parametrize("body, param, words", [
    ({"input": ""}, "input", "at least one token"),
    ({"input": []}, "input", "must not be empty"),
    ({"input": [[]]}, "input", "must not be empty"),
    ({"input": list(range(1, MAX_MODEL_LEN + 2))}, "input", "maximum context length"),
    ({"input": "x", "dimensions": 0}, "dimensions", "between 1"),
    ({"input": "x", "dimensions": SPEC.hidden_size + 1}, "dimensions", "between 1"),
    ({"input": "x", "encoding_format": "int8"}, None, "encoding_format"),
])
def test_bad_requests(embed_server: LiveServer, body: dict[str, object], param: str | None,
                      words: str) -> None:
    r = httpx.post(f"{embed_server.url}/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] or words == error["param"], error
    if param is not None:
        assert error["param"] == param


def test_tasks_refuse_each_others_routes(embed_server: LiveServer, server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError, match="serves embeddings"):
        embed_server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="serves embeddings"):
        embed_server.client().completions.create(model=MODEL, prompt="hi")
    with pytest.raises(openai.BadRequestError, match="does not support the Embeddings API"):
        server.client().embeddings.create(model=MODEL, input="hi")

