"""From a `StructuredOutput` to an llguidance grammar, and from that to per-request matchers.

llguidance was picked over xgrammar by measurement (benchmarks/grammar_libraries.py, results in
benchmarks/results/2026-11-23-cpu-grammar-libraries.json): with the Qwen3 vocabulary it
compiles a JSON schema many times faster than xgrammar at the median and at the tail, and it
is one small wheel with no dependencies. xgrammar fills a typical mask faster, which the engine
hides by filling masks while the device runs the step's forward."""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence

import llguidance

from openinfer_core.errors import InvalidParameterError
from openinfer_core.params import StructuredOutput
from openinfer_core.structured.finite_schema import has_finite_instance

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

# The frontend's check compiles against a vocabulary of the 256 bytes, so it needs no
# tokenizer, and walks a few bytes into the grammar: llguidance builds lexers lazily, so a
# grammar too large for its limits (`a{1000000}`) fails only once text is fed. Its lexer fuel
# is a fifth of llguidance's default, which keeps a check within tens of milliseconds.
_CHECK_LIMITS = llguidance.LLParserLimits(initial_lexer_fuel=200_000, verbose_errors=False)
CHECK_BYTES = 8
_DEAD_END = "NoExtensionBias"  # llguidance's error when no byte can come next
_EOS = 256


def check(spec: StructuredOutput) -> None:
    """Raise InvalidParameterError (naming the field) unless `spec` compiles within the
    check's limits and admits at least one string. No tokenizer needed: the frontend checks
    before the engine sees the request.

    Refused: grammars that do not compile, that admit no string at all (`start: start`, a
    JSON schema whose instances nest without end), and that exceed the limits within the
    first bytes. A grammar whose dead ends lie deeper is not caught: the engine then stops
    the request when no token can follow."""
    source = grammar_source(spec)
    param = _PARAM[spec.kind]
    if spec.kind == "json" and not has_finite_instance(json.loads(spec.spec)):
        raise InvalidParameterError(
            param, "admits no finite JSON value: every instance would nest without end "
            "(a required property or item refers back to an enclosing schema)")
    matcher = llguidance.LLMatcher(_byte_tokenizer(), source, log_level=0,
                                   limits=_CHECK_LIMITS)
    for fed in range(CHECK_BYTES + 1):
        mask = matcher.compute_bitmask()
        if matcher.is_error():
            error = matcher.get_error().split("\n<non-verbose/>")[0]
            if fed == 0 and error == _DEAD_END:
                raise InvalidParameterError(param, "admits no string: nothing can be "
                                            "generated that the grammar accepts")
            if fed == 0:
                raise InvalidParameterError(param, f"cannot be compiled: {error}")
            if error != _DEAD_END:  # a dead end after a byte is that branch's, not the grammar's
                raise InvalidParameterError(param, f"is too large to compile: {error}")
            return
        byte = _first_byte(mask)
        if matcher.is_accepting() or byte is None:
            return
        matcher.consume_token(byte)


def _first_byte(mask: bytes) -> int | None:
    """The lowest byte the mask allows (not EOS), or None."""
    for i, bits in enumerate(mask[:32]):
        if bits:
            return i * 8 + (bits & -bits).bit_length() - 1
    return None


@functools.cache
def _byte_tokenizer() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), slices=[])


class _Bytes:
    """A tokenizer of 256 one-byte tokens and an end-of-sequence token, as llguidance's
    `TokenizerWrapper` reads one."""

    eos_token_id = _EOS
    bos_token_id = None
    tokens = (*(bytes([i]) for i in range(256)), b"</s>")
    special_token_ids = (_EOS,)

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


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
