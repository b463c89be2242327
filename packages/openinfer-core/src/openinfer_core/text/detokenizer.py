"""Turn generated token ids into text one token at a time."""

from __future__ import annotations

from collections.abc import Sequence

from openinfer_core.text.tokenizer import Tokenizer

# How many prompt tokens to decode in front of the output. Some decoders (SentencePiece's
# Metaspace, byte-level with cleanup) render a token differently at the very start of a
# string, so the first output token needs a little left context to get its spacing right.
PROMPT_CONTEXT_TOKENS = 5

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Per-request streaming decoder. Not thread-safe; one instance per sequence.

    `self._ids` is a small window: `ids[:read_offset]` (the prefix) was emitted already and is
    kept only as left context, the rest is held back. Each push decodes the window with and
    without the held tokens and emits the difference, then drops the old prefix, so the work
    per token stays a few tokens' worth however long the output gets.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._read_offset = len(self._ids)
        self._emitted: list[str] = []

    @property
    def text(self) -> str:
        """All text returned so far by push() and flush()."""
        return "".join(self._emitted)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text it completes (may be "")."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[: self._read_offset])
        full_text = self._decode(self._ids)
        # A trailing U+FFFD means the last tokens end inside a multi-byte character; wait
        # for the bytes that complete it.
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        return self._emit(full_text[len(prefix_text) :])

    def flush(self) -> str:
        """Release whatever push() held back (at the end of generation), broken or not."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[: self._read_offset])
        full_text = self._decode(self._ids)
        return self._emit(full_text[len(prefix_text) :])

    def _emit(self, delta: str) -> str:
        # The tokens just emitted become the next prefix; older ones are never needed again.
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        if delta:
            self._emitted.append(delta)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)
