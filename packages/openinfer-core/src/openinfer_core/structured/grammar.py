"""From a `StructuredOutput` to an llguidance grammar, and from that to per-request matchers.

llguidance was picked over xgrammar by measurement (benchmarks/grammar_libraries.py, results in
benchmarks/results/2026-11-23-cpu-grammar-libraries.json): with the Qwen3 vocabulary it
compiles a JSON schema many times faster than xgrammar at the median and at the tail, and it
is one small wheel with no dependencies. xgrammar fills a typical mask faster, which the engine
hides by filling masks while the device runs the step's forward."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence

import llguidance

from openinfer_core.errors import InvalidParameterError
from openinfer_core.params import StructuredOutput

# Grammar text -> compiled matcher to copy. Schemas repeat (one per tool, per app), and a copy
# costs microseconds where a compile costs milliseconds.
CACHE_SIZE = 256


def grammar_source(spec: StructuredOutput) -> str:
    """llguidance's grammar text for `spec`; raises InvalidParameterError when `spec` is not
    even well formed (what it means is checked by `check`)."""
    kind = spec.kind
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(
            {"type": "object"}, defaults={"whitespace_flexible": False})
    if kind == "json":
        try:
            schema = json.loads(spec.spec)
        except json.JSONDecodeError as exc:
            raise InvalidParameterError("json_schema", f"is not valid JSON: {exc}") from exc
        if not isinstance(schema, dict):
            raise InvalidParameterError("json_schema", "must be a JSON object")
        return llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False})
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.spec)
    if kind == "choice":
        choices = json.loads(spec.spec)
        if not isinstance(choices, list) or not choices \
                or not all(isinstance(c, str) for c in choices):
            raise InvalidParameterError("choice", "must be a non-empty list of strings")
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c) for c in choices))
    return llguidance.LLMatcher.grammar_from_lark(spec.spec)


_PARAM = {"json": "json_schema", "json_object": "response_format", "regex": "regex",
          "choice": "choice", "grammar": "grammar"}


def check(spec: StructuredOutput) -> None:
    """Raise InvalidParameterError (naming the field) unless `spec` compiles. No tokenizer
    needed: the frontend checks before the engine sees the request."""
    source = grammar_source(spec)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source)
    if is_error:
        raise InvalidParameterError(_PARAM[spec.kind], f"cannot be compiled: {messages[0]}")


class GrammarCompiler:
    """Compiles grammars against one model's vocabulary. Thread-safe; `compile` drops the GIL
    while llguidance builds the grammar."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]):
        self.vocab_size = vocab_size
        self._tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                 eos_token=list(eos_token_ids) or None)
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutput) -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start; raises InvalidParameterError if it does not
        compile."""
        source = grammar_source(spec)
        with self._lock:
            proto = self._cache.get(source)
            if proto is not None:
                self._cache.move_to_end(source)
                return proto.deep_copy()
        matcher = llguidance.LLMatcher(self._tokenizer, source, log_level=0)
        if matcher.is_error():
            raise InvalidParameterError(_PARAM[spec.kind],
                                        f"cannot be compiled: {matcher.get_error()}")
        with self._lock:
            self._cache[source] = matcher
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher.deep_copy()
