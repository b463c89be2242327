"""Sampling parameters: what a client may ask of the sampler, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from openinfer_core.errors import InvalidParameterError

# vLLM's threshold: below this temperature sampling is greedy.
GREEDY_EPSILON = 1e-5


def _check_range(name: str, value: float, lo: float, hi: float, *, lo_open: bool = False,
                 hi_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise InvalidParameterError(name, f"must be a number, got {value!r}")
    below = value <= lo if lo_open else value < lo
    above = value >= hi if hi_open else value > hi
    if below or above:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise InvalidParameterError(
            name, f"must be in {left}{lo:g}, {hi:g}{right}, got {value!r}"
        )


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the generated text, enforced token by token with a grammar.

    `kind` says how to read `spec`: "json" a JSON schema (as JSON text), "json_object" any JSON
    object (`spec` unused), "regex" a regular expression, "choice" a JSON list of the allowed
    strings, "grammar" a Lark grammar (llguidance's dialect, which also reads GBNF-like
    rules)."""

    kind: str
    spec: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise InvalidParameterError(
                "structured_outputs", f"kind must be one of {', '.join(STRUCTURED_KINDS)}, "
                f"got {self.kind!r}")
        if not isinstance(self.spec, str):
            raise InvalidParameterError("structured_outputs", "spec must be a string")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the next token is chosen. Defaults are greedy-free sampling at temperature 1,
    like vLLM's; `temperature=0` (or `top_k=1`) is greedy.

    Raises `InvalidParameterError` naming the field and its allowed range."""

    temperature: float = 1.0
    top_k: int = -1  # -1 (or 0) disables
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N alternatives; 0 = only the sampled token's logprob
    # Logprobs of the prompt's tokens (each given the ones before it) with top-N alternatives,
    # sent once, before the first token. Such a request takes no prefix-cache hit.
    prompt_logprobs: int | None = None
    structured: StructuredOutput | None = None
    # Text-side fields: the engine never sees text, so frontends (LLM, the server) honour these.
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        _check_range("temperature", self.temperature, 0.0, 100.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise InvalidParameterError("top_k", f"must be an integer, got {self.top_k!r}")
        if self.top_k < -1:
            raise InvalidParameterError(
                "top_k", f"must be -1 (disabled), 0 (disabled) or >= 1, got {self.top_k}"
            )
        _check_range("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("repetition_penalty", self.repetition_penalty, 0.0, 2.0, lo_open=True)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
            or not -(2**63) <= self.seed < 2**64
        ):
            raise InvalidParameterError("seed", f"must be a 64-bit integer, got {self.seed!r}")
        for name in ("max_tokens", "min_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidParameterError(name, f"must be an integer, got {v!r}")
        if self.max_tokens < 1:
            raise InvalidParameterError("max_tokens", f"must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidParameterError(
                "min_tokens",
                f"must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}",
            )
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                                  or not 0 <= v <= 20):
                raise InvalidParameterError(name, f"must be in [0, 20], got {v!r}")
        for t in self.stop_token_ids:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise InvalidParameterError(
                    "stop_token_ids", f"must be non-negative token ids, got {t!r}"
                )
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        for s in stop:
            if not isinstance(s, str) or not s:
                raise InvalidParameterError("stop", f"stop strings must be non-empty, got {s!r}")
        object.__setattr__(self, "stop", stop)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON or self.top_k == 1

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 1

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )
