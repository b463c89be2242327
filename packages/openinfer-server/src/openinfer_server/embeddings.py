"""POST /v1/embeddings (OpenAI's format): each input's last-token hidden state, L2-normalized,
from an engine serving task `embed` (Qwen3-Embedding's recipe). All inputs of a request go to
the engine at once, so its scheduler batches them.

An engine serves one task, as vLLM's runners do: on a generating engine this route is a 400,
and on an embedding engine the generation routes are (`requires_generate`)."""

from __future__ import annotations

import asyncio
import base64
import uuid
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter
from pydantic import Field

from openinfer_core.errors import InvalidParameterError, TooManyTokensError
from openinfer_core.events import Embedding, Error, Rejected
from openinfer_core.request import GenerateRequest
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.errors import APIError
from openinfer_server.json_body import JSONBodyRoute
from openinfer_server.prompt_limit import PromptLimit
from openinfer_server.prompts import ids_prompt, text_prompt
from openinfer_server.protocol import _Body
from openinfer_server.state import ServerState, StateDep
from openinfer_server.validation import Int64, TokenId

router = APIRouter(route_class=JSONBodyRoute)

EmbeddingInput = str | list[str] | list[TokenId] | list[list[TokenId]]


class EmbeddingRequest(_Body):
    input: EmbeddingInput
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Int64 | None = None
    user: str | None = None
    # vLLM's extra: the tokenizer's special tokens (Qwen3-Embedding's appends <|endoftext|>).
    add_special_tokens: bool = Field(True)


@router.post("/v1/embeddings")
async def create_embeddings(body: EmbeddingRequest, state: StateDep) -> dict[str, Any]:
    state.check_model(body.model)
    state.check_serving()
    info = state.engine.model_info
    if info.task != "embed":
        raise APIError(400, "This model does not support the Embeddings API: it serves text "
                       "generation. Serve an embedding checkpoint (one with a "
                       "sentence-transformers Pooling module) or start the server with "
                       "--task embed.", param="model", code="model_not_embedding")
    dims = body.dimensions
    if dims is not None and not 1 <= dims <= info.hidden_size:
        raise APIError(400, f"dimensions must be between 1 and the model's {info.hidden_size}, "
                       f"got {dims}", param="dimensions")
    limit = replace(state.prompt_limit, max_tokens=state.max_model_len)
    try:
        inputs = await state.threads.run(embedding_inputs, body.input, state.tokenizer,
                                         add_special_tokens=body.add_special_tokens,
                                         limit=limit)
    except TooManyTokensError as e:
        raise APIError(400, f"This model's maximum context length is {state.max_model_len} "
                       f"tokens. However, you requested {e.count} tokens in the input for "
                       "embedding generation. Please reduce the length of the input.",
                       param="input") from None
    request_id = f"embd-{uuid.uuid4().hex}"
    vectors = await asyncio.gather(*(
        _embed(state, GenerateRequest(f"{request_id}-{i}", tuple(ids), pooling=True))
        for i, ids in enumerate(inputs)))
    data = [{"object": "embedding", "index": i,
             "embedding": encode(normalized(v, dims), body.encoding_format)}
            for i, v in enumerate(vectors)]
    tokens = sum(len(ids) for ids in inputs)
    return {"object": "list", "data": data, "model": state.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def embedding_inputs(value: EmbeddingInput, tokenizer: Tokenizer, *, add_special_tokens: bool,
                     limit: PromptLimit) -> list[list[int]]:
    """One string, several, one list of token ids, or several, as token-id lists. Tokenizes:
    call it on a worker thread."""
    items: list[str] | list[list[int]] | list[str | list[int]]
    if isinstance(value, str):
        items = [value]
    elif not value:
        raise InvalidParameterError("input", "must not be empty")
    elif all(isinstance(v, int) for v in value):
        items = [value]  # type: ignore[assignment]
    else:
        items = value  # type: ignore[assignment]
    out: list[list[int]] = []
    for item in items:
        if isinstance(item, str):
            out.append(text_prompt(item, tokenizer, add_special_tokens=add_special_tokens,
                                   limit=limit, where="input").token_ids)
        elif not item:
            raise InvalidParameterError("input", "a token-id input must not be empty")
        else:
            out.append(ids_prompt(item, tokenizer, limit).token_ids)
    return out


async def _embed(state: ServerState, request: GenerateRequest) -> np.ndarray:
    """The engine's vector for one pooling request; leaving early (the client went) aborts it."""
    vector: tuple[float, ...] | None = None
    async for event in state.engine.generate(request):
        if isinstance(event, Embedding):
            vector = event.vector
        elif isinstance(event, Rejected):
            raise APIError(400, event.message, param="input")
        elif isinstance(event, Error):
            raise APIError(500, f"the engine failed on this request: {event.message}")
    if vector is None:
        raise APIError(500, f"the engine ended {request.request_id} without its embedding")
    return np.asarray(vector, dtype=np.float32)


def normalized(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    """L2-normalized, after truncation to `dimensions` (Matryoshka) where given."""
    if dimensions is not None:
        vector = vector[:dimensions]
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    return vector / np.float32(max(norm, 1e-12))


def encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A list of floats, or (OpenAI's base64) the little-endian float32 bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector.tolist()]


async def requires_generate(state: StateDep) -> None:
    """Dependency of the generation routes: a 400 on an engine serving embeddings."""
    if state.engine.model_info.task == "embed":
        raise APIError(400, "This model serves embeddings (task embed): use /v1/embeddings. "
                       "It does not support the Completions or Chat Completions API.",
                       param="model", code="model_not_generative")
