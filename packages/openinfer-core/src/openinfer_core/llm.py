"""The offline API, in the spirit of vLLM's `LLM(model).generate(prompts, sampling_params)`."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.errors import InvalidParameterError, TokenizerError
from openinfer_core.events import (
    Error,
    Finished,
    PromptLogprobs,
    Rejected,
    Scheduled,
    Token,
    TokenEvent,
)
from openinfer_core.generation_config import sampling_defaults
from openinfer_core.outputs import CompletionOutput, RequestOutput
from openinfer_core.params import SamplingParams
from openinfer_core.plugins import PluginManager, get_plugin_manager
from openinfer_core.registry import import_target
from openinfer_core.request import GenerateRequest
from openinfer_core.text.detokenizer import IncrementalDetokenizer
from openinfer_core.text.stop_strings import StopStringMatcher
from openinfer_core.text.tokenizer import Tokenizer

Prompt = str | Sequence[int] | Mapping[str, Any]
Message = Mapping[str, Any]


@dataclass(slots=True)
class _Pending:
    """One request's text-side state while the engine runs it."""

    output: RequestOutput
    params: SamplingParams
    detok: IncrementalDetokenizer | None
    stop: StopStringMatcher | None
    done: bool = False
    text: list[str] = field(default_factory=list)


class LLM:
    """Load a checkpoint folder and generate from it, synchronously, on this thread."""

    def __init__(self, model: str | Path, *, tokenizer: str | Path | None = None,
                 plugins: PluginManager | None = None, generation_config: str = "auto",
                 **engine_args: Any) -> None:
        """`generation_config`, as vLLM's: "auto" takes the sampling defaults recommended in
        the checkpoint's generation_config.json, "vllm" the built-in ones, a folder its own
        generation_config.json's. They apply when `generate` gets no sampling params."""
        self._default_params = SamplingParams(**sampling_defaults(generation_config, model))
        self._plugins = plugins or get_plugin_manager()
        self.engine = Engine(EngineConfig(model=str(model), **engine_args), self._plugins)
        self._tokenizer_dir = Path(tokenizer or model)
        self._tokenizer: Tokenizer | None = None
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Tokenizer:
        """Loaded on first use, so token-id-only use needs no tokenizer files."""
        if self._tokenizer is None:
            # The model line's own chat renderer, where it registers one, as the server does.
            line = self._plugins.registries.models.match(self.engine.hf_config)
            target = line.meta.get("chat_encoder")
            self._tokenizer = Tokenizer.from_dir(
                self._tokenizer_dir, chat_encoder=import_target(target)() if target else None)
        return self._tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` uses when given no sampling params."""
        return self._default_params

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Run every prompt (text, token ids, or {"prompt_token_ids": [...]}) to completion;
        outputs come back in prompt order. All prompts are batched together."""
        batch = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = self._default_params
        params = _as_params_list(sampling_params, len(batch))
        pending: dict[str, _Pending] = {}
        for prompt, sp in zip(batch, params, strict=True):
            text, ids = self._encode(prompt)
            request = GenerateRequest(f"llm-{next(self._ids)}", tuple(ids), sp)
            pending[request.request_id] = self._pending(request, text, sp)
            self.engine.add_request(request)
        # Keep stepping after the last output: requests ended by a stop string were aborted
        # and give their KV back on the next step.
        while any(not p.done for p in pending.values()) or self.engine.has_work():
            for event in self.engine.step():
                if event.request_id in pending:
                    self._apply(pending[event.request_id], event)
        return [p.output for p in pending.values()]

    def chat(self, messages: Sequence[Message] | Sequence[Sequence[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             add_generation_prompt: bool = True,
             chat_template_kwargs: Mapping[str, Any] | None = None) -> list[RequestOutput]:
        """Render each conversation with the model line's chat encoder, else the checkpoint's
        chat template, then `generate`."""
        if not messages:
            raise InvalidParameterError("messages", "must not be empty")
        conversations = [messages] if isinstance(messages[0], Mapping) else messages
        prompts = [
            self.tokenizer.apply_chat_template(
                list(conv), add_generation_prompt=add_generation_prompt,  # type: ignore[arg-type]
                **dict(chat_template_kwargs or {}))
            for conv in conversations
        ]
        # The template already placed any special tokens; do not add a BOS again.
        token_prompts = [{"prompt": p, "prompt_token_ids": self.tokenizer.encode(
            p, add_special_tokens=False)} for p in prompts]
        return self.generate(token_prompts, sampling_params)

    # -- helpers -------------------------------------------------------------------------
    def _encode(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
            raise InvalidParameterError(
                "prompt", "a dict prompt needs 'prompt' or 'prompt_token_ids'")
        return None, list(prompt)

    def _pending(self, request: GenerateRequest, text: str | None,
                 sp: SamplingParams) -> _Pending:
        detok = stop = None
        try:
            tokenizer: Tokenizer | None = self.tokenizer
        except TokenizerError:
            if sp.stop:
                raise
            tokenizer = None  # token ids in, token ids out
        if tokenizer is not None:
            detok = IncrementalDetokenizer(tokenizer, request.prompt_token_ids,
                                           skip_special_tokens=sp.skip_special_tokens)
        if sp.stop:
            stop = StopStringMatcher(
                sp.stop, include_stop_str_in_output=sp.include_stop_str_in_output)
        out = RequestOutput(request.request_id, text, list(request.prompt_token_ids),
                            [CompletionOutput(0, "", [], None,
                                              [] if sp.logprobs is not None else None)],
                            prompt_logprobs=[None] if sp.prompt_logprobs is not None else None)
        return _Pending(out, sp, detok, stop)

    def _apply(self, p: _Pending, event: TokenEvent) -> None:
        completion = p.output.outputs[0]
        if p.done:
            return
        if isinstance(event, Token):
            completion.token_ids.append(event.token_id)
            if completion.logprobs is not None and event.logprob is not None:
                entry = dict(event.top_logprobs)
                entry[event.token_id] = event.logprob
                completion.logprobs.append(entry)
            if p.detok is not None:
                self._push_text(p, p.detok.push(event.token_id))
        elif isinstance(event, Finished):
            if p.detok is not None:
                self._push_text(p, p.detok.flush())
            if not p.done and p.stop is not None:
                p.text.append(p.stop.flush())
            if not p.done:
                completion.finish_reason = event.reason.value
                completion.stop_reason = event.stop_token_id
            self._close(p)
        elif isinstance(event, Error | Rejected):
            completion.error = event.message
            self._close(p)
        elif isinstance(event, PromptLogprobs):
            ids = p.output.prompt_token_ids
            p.output.prompt_logprobs = [None] + [
                {**dict(top), ids[i + 1]: lp}
                for i, (lp, top) in enumerate(zip(event.logprobs, event.top, strict=True))]
        elif isinstance(event, Scheduled):
            p.output.num_cached_tokens = event.cached_tokens
        # (An `Embedding` comes only to pooling requests, which `LLM` never sends.)

    def _push_text(self, p: _Pending, delta: str) -> None:
        if p.done or not delta:
            return
        if p.stop is None:
            p.text.append(delta)
            return
        emit, hit = p.stop.feed(delta)
        p.text.append(emit)
        if hit:
            completion = p.output.outputs[0]
            completion.finish_reason = "stop"
            completion.stop_reason = p.stop.matched
            self.engine.abort(p.output.request_id)
            self._close(p)

    @staticmethod
    def _close(p: _Pending) -> None:
        p.output.outputs[0].text = "".join(p.text)
        p.done = True


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str | Mapping):
        return [prompts]
    if not prompts:
        raise InvalidParameterError("prompts", "must not be empty")
    if all(isinstance(t, int) for t in prompts):
        return [prompts]  # type: ignore[list-item]  # one prompt of token ids
    return list(prompts)  # type: ignore[arg-type]


def _as_params_list(params: SamplingParams | Sequence[SamplingParams] | None,
                    n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise InvalidParameterError(
            "sampling_params", f"got {len(params)} for {n} prompts; pass one or one per prompt")
    return list(params)
