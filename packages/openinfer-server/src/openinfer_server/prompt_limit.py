"""How long a prompt may be: at most `max_model_len - 1` tokens (one is left to generate), and,
checked before tokenizing (about a second a megabyte), at most the characters that many tokens
can stand for under the loaded tokenizer.

The characters one token can stand for are read from the tokenizer itself: the longest
vocabulary entry (in byte-level BPE one character is one byte; a SentencePiece piece spells its
text; an added token is its content), times what the normalizer can shrink the text by. That
holds only where no step drops characters, so a tokenizer with a step that may (a pre-tokenizer
that removes whitespace, a normalizer that strips accents, an unknown token that swallows a
whole word) gets no character bound: its prompts are tokenized, on a worker thread, and counted."""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any

from tokenizers import pre_tokenizers
from tokenizers.models import BPE, Unigram

from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.errors import APIError

# How many characters of text one character of a normalizer's output can stand for. Those that
# only lengthen text count 1. Composition turns a text into fewer characters, each standing for
# its decomposition: at most 4 characters canonically (NFC; U+1F82 is 4 under NFD) and 18 under
# compatibility (NFKC; U+FDFA is 18 under NFKD), as every character decomposes to >= 1.
_NORMALIZER_SHRINK = {"NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1, "ByteLevel": 1,
                      "NFC": 4, "NFKC": 18}
# Pre-tokenizers that keep every character (Split and Punctuation unless told to remove).
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "Split",
                           "Punctuation"}


@dataclass(frozen=True, slots=True)
class PromptLimit:
    """`max_tokens`: the most tokens a prompt may have (None: any number, as /tokenize counts);
    `chars_per_token`: the most characters one token can stand for (None: no bound known)."""

    max_model_len: int
    max_tokens: int | None
    chars_per_token: int | None

    @classmethod
    def for_model(cls, max_model_len: int, tokenizer: Tokenizer) -> PromptLimit:
        return cls(max_model_len, max_model_len - 1, chars_per_token(tokenizer))

    def counting_only(self) -> PromptLimit:
        """The limit of /tokenize: the same character bound, any number of tokens."""
        return PromptLimit(self.max_model_len, None, self.chars_per_token)

    @property
    def max_chars(self) -> int | None:
        """More characters than this cannot fit `max_model_len` tokens."""
        if self.chars_per_token is None:
            return None
        return self.max_model_len * self.chars_per_token

    def check_chars(self, text: str, where: str) -> None:
        """A 400 for a `where` ("prompt", "messages") too long to fit under any tokenization."""
        most = self.max_chars
        if most is not None and len(text) > most:
            raise APIError(
                400, f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, your {where} has {len(text)} characters, more than the {most} that "
                f"{self.max_model_len} tokens can hold (one token of this model stands for at "
                f"most {self.chars_per_token} characters). Please reduce the length of the "
                f"{where}.", param=where, code="context_length_exceeded")


def chars_per_token(tokenizer: Tokenizer) -> int | None:
    """The most characters of text one token of `tokenizer` can stand for, or None when a
    step of it may drop characters (see the module docstring). Read once per tokenizer (a
    large vocabulary takes a few tenths of a second)."""
    if tokenizer not in _read:
        _read[tokenizer] = _chars_per_token(tokenizer)
    return _read[tokenizer]


_read: weakref.WeakKeyDictionary[Tokenizer, int | None] = weakref.WeakKeyDictionary()


def _chars_per_token(tokenizer: Tokenizer) -> int | None:
    backend = tokenizer.backend
    if any(t.lstrip or t.rstrip for t in backend.get_added_tokens_decoder().values()):
        return None  # such an added token takes in the whitespace around it, however long
    shrink = _shrink(_state(backend.normalizer))
    if shrink is None or not _keeps_characters(_state(backend.pre_tokenizer)):
        return None
    if not _knows_every_character(tokenizer):
        return None
    return shrink * max(map(len, backend.get_vocab(with_added_tokens=True)))


def _state(component: Any) -> dict[str, Any] | None:
    return None if component is None else dict(json.loads(component.__getstate__()))


def _shrink(normalizer: dict[str, Any] | None) -> int | None:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        total = 1
        for part in normalizer.get("normalizers", []):
            factor = _shrink(part)
            if factor is None:
                return None
            total *= factor
        return total
    if kind == "Replace":
        pattern, content = normalizer.get("pattern", {}).get("String"), normalizer["content"]
        if pattern is None or not content:
            return None  # a regular expression or an empty replacement may drop any amount
        return max(1, -(-len(pattern) // len(content)))
    return _NORMALIZER_SHRINK.get(str(kind))


def _keeps_characters(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_characters(p) for p in pre_tokenizer.get("pretokenizers", []))
    return kind in _KEEPING_PRE_TOKENIZERS and pre_tokenizer.get("behavior") != "Removed"


def _knows_every_character(tokenizer: Tokenizer) -> bool:
    """Whether the model turns every character into tokens of its own: with byte fallback,
    with a byte-level alphabet that is all in the vocabulary, or with an unknown token given
    to each unknown character alone. (BPE without any of these drops unknown characters;
    WordPiece and WordLevel give one unknown token to a whole word.)"""
    backend = tokenizer.backend
    model = backend.model
    if isinstance(model, BPE) and model.byte_fallback:
        return True
    if isinstance(model, Unigram):  # its Python object does not show byte_fallback
        return bool(json.loads(model.__getstate__()).get("byte_fallback"))
    if not isinstance(model, BPE):
        return False
    if model.unk_token is not None and not model.fuse_unk:
        return True
    pre = json.dumps(_state(backend.pre_tokenizer))
    return '"ByteLevel"' in pre and all(
        backend.token_to_id(c) is not None for c in pre_tokenizers.ByteLevel.alphabet())
