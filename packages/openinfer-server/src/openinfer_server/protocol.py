"""Request bodies of the OpenAI-compatible endpoints, with vLLM's sampling extras.

Numbers are typed with validation.py's bounded types (what the engine can carry: a 64-bit
integer, a finite float) and checked against the vocabulary there; what a value means beyond
that (top_p in (0, 1]) is checked by `SamplingParams`, so a bad value gets the same message
whether it came through HTTP or the offline API. Unknown fields are ignored, as OpenAI-style
servers do; known fields we cannot honour are refused."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from openinfer_core.errors import InvalidParameterError
from openinfer_core.params import SamplingParams
from openinfer_server import legacy_functions
from openinfer_server.surrogates import lone_surrogate_path
from openinfer_server.validation import (
    Finite,
    Int64,
    Seed,
    TokenId,
    check_tools,
    check_vocabulary,
)

MAX_N = 128  # choices per prompt; beyond this a request is more likely a mistake than a need
_NO_DEFAULTS: Mapping[str, Any] = MappingProxyType({})


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _refuse_lone_surrogates(cls, data: Any) -> Any:
        where = lone_surrogate_path(data)
        if where is not None:
            raise PydanticCustomError(
                "lone_surrogate", "holds a lone UTF-16 surrogate (such as \\ud800), which is "
                "not valid Unicode text; send well-formed strings", {"param": where})
        return data


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: Int64 | None = None
    temperature: Finite | None = None
    top_p: Finite | None = None
    seed: Seed | None = None
    presence_penalty: Finite | None = None
    frequency_penalty: Finite | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, Finite] | None = None
    # vLLM's extras
    top_k: Int64 | None = None
    min_p: Finite | None = None
    repetition_penalty: Finite | None = None
    ignore_eos: bool = False
    min_tokens: Int64 = 0
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: Int64 = 0
    use_beam_search: bool = False
    prompt_logprobs: Int64 | None = None
    return_tokens_as_token_ids: bool = False
    # Structured output: OpenAI's response_format, vLLM's structured_outputs and its older
    # guided_* fields (structured.py reads them; at most one may be given).
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def sampling_params(self, max_tokens: int, logprobs: int | None, vocab_size: int,
                        logprobs_field: str = "logprobs",
                        defaults: Mapping[str, Any] = _NO_DEFAULTS) -> SamplingParams:
        """The sampler's view of this request; raises InvalidParameterError naming a field.
        `vocab_size` bounds top_k and the token ids; `defaults` (the server's, from
        generation_config.json) fill the sampling fields the request leaves out, before the
        built-in ones."""
        self.refuse_unsupported()
        check_vocabulary(vocab_size, top_k=self.top_k, stop_token_ids=self.stop_token_ids)
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        d = defaults
        try:
            return SamplingParams(
                temperature=_or(self.temperature, d.get("temperature", 1.0)),
                top_k=_or(self.top_k, d.get("top_k", -1)),
                top_p=_or(self.top_p, d.get("top_p", 1.0)),
                min_p=_or(self.min_p, d.get("min_p", 0.0)), seed=self.seed,
                repetition_penalty=_or(self.repetition_penalty,
                                       d.get("repetition_penalty", 1.0)),
                frequency_penalty=_or(self.frequency_penalty, 0.0),
                presence_penalty=_or(self.presence_penalty, 0.0),
                max_tokens=max_tokens, min_tokens=self.min_tokens,
                stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
                logprobs=logprobs, stop=stop,
                include_stop_str_in_output=self.include_stop_str_in_output,
                skip_special_tokens=self.skip_special_tokens)
        except InvalidParameterError as e:
            if e.param == "logprobs" and logprobs_field != "logprobs":
                raise InvalidParameterError(logprobs_field, str(e).split(": ", 1)[1]) from e
            raise

    def refuse_unsupported(self) -> None:
        if self.logit_bias:
            raise InvalidParameterError("logit_bias", "is not supported by openinfer; omit it")
        if self.use_beam_search:
            raise InvalidParameterError("use_beam_search", "beam search is not supported")
        if self.stream_options is not None and not self.stream:
            raise InvalidParameterError("stream_options", "is only allowed with stream=true")
        if self.max_tokens is not None and self.max_tokens < self.min_max_tokens:
            raise InvalidParameterError(
                "max_tokens", f"must be >= {self.min_max_tokens}, got {self.max_tokens}")

    @property
    def min_max_tokens(self) -> int:
        return 1

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    echo: bool = False
    logprobs: Int64 | None = None
    suffix: str | None = None
    best_of: Int64 | None = None
    add_special_tokens: bool = True

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.suffix:
            raise InvalidParameterError("suffix", "is not supported by openinfer; omit it")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidParameterError("best_of", "is not supported unless equal to n")

    @property
    def min_max_tokens(self) -> int:
        """With echo, max_tokens 0 scores the prompt and generates nothing (as OpenAI)."""
        return 0 if self.echo else 1

    @property
    def prompt_logprobs_count(self) -> int | None:
        """echo with logprobs reports the prompt's tokens too (vLLM's prompt_logprobs wins)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo and self.logprobs is not None else None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """Extra fields (tool_calls, tool_call_id, reasoning_content, ...) reach the template."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        message = self.model_dump(exclude_none=True)
        message.setdefault("content", None)
        if message["role"] == "developer":  # OpenAI's newer name for the system role
            message["role"] = "system"
        return message


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int64 | None = None
    logprobs: bool = False
    top_logprobs: Int64 | None = None
    # Checked against OpenAI's definition whatever tool_choice says; the dicts reach the chat
    # template as sent.
    tools: Annotated[list[dict[str, Any]], AfterValidator(check_tools)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's deprecated names for tools / tool_choice, mapped onto them before validation
    # (legacy_functions.py); a request that used them is answered in their format.
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's reasoning models' field; passed to the chat template or encoder as
    # `reasoning_effort` (DeepSeek-V4's encoder reads it), unless chat_template_kwargs sets it.
    reasoning_effort: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    _legacy_functions = model_validator(mode="before")(legacy_functions.to_tools)

    @property
    def call_format(self) -> Literal["tool_calls", "function_call"]:
        return "tool_calls" if self.functions is None else "function_call"

    @property
    def max_tokens_field(self) -> tuple[str, int | None]:
        """The field that sets the completion's length, and its value: max_completion_tokens
        is OpenAI's newer name for max_tokens; it wins when both are given."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.max_completion_tokens is not None and self.max_completion_tokens < 1:
            raise InvalidParameterError(
                "max_completion_tokens", f"must be >= 1, got {self.max_completion_tokens}")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParameterError("top_logprobs", "needs logprobs=true")
        if self.continue_final_message:
            raise InvalidParameterError("continue_final_message", "is not supported")

    @property
    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value
