"""Token logprobs in the two wire formats: completions' parallel lists and chat's objects."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from openinfer_core.events import PromptLogprobs
from openinfer_core.text.tokenizer import Tokenizer

# JSON has no -Infinity; OpenAI-compatible servers report impossible tokens as this.
FLOOR_LOGPROB = -9999.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token: its logprob, its alternatives (best first), and where its text begins in
    the choice's text. An echoed prompt's first token has neither (None)."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] | None
    text_offset: int


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR_LOGPROB


def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE (GPT-2, Qwen) spells each byte as one printable character: printable
    Latin-1 bytes as themselves, the other 68 as U+0100 onwards, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(0x100 + extra)] = b
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_table()


class TokenText:
    """Token id -> display string and raw bytes, cached per id. Thread-safe (read-mostly)."""

    def __init__(self, tokenizer: Tokenizer, *, as_ids: bool = False) -> None:
        self._tokenizer = tokenizer
        self._as_ids = as_ids
        self.text = lru_cache(maxsize=65536)(self._text)
        self.bytes = lru_cache(maxsize=65536)(self._bytes)

    def _text(self, token_id: int) -> str:
        if self._as_ids:
            return f"token_id:{token_id}"
        return self._tokenizer.decode([token_id])

    def _bytes(self, token_id: int) -> list[int]:
        piece = self._tokenizer.convert_ids_to_tokens([token_id])[0]
        if piece is not None and piece and all(c in _BYTE_LEVEL for c in piece):
            return [_BYTE_LEVEL[c] for c in piece]
        return list(self._tokenizer.decode([token_id]).encode("utf-8"))


def completion_logprobs(entries: list[TokenLogprob], names: TokenText) -> dict[str, Any]:
    """Completions style: parallel lists; each top_logprobs entry holds the sampled token
    and its alternatives."""
    tops: list[dict[str, float] | None] = []
    for e in entries:
        if e.logprob is None or e.top is None:
            tops.append(None)
            continue
        top = {names.text(t): finite(lp) for t, lp in e.top}
        top.setdefault(names.text(e.token_id), finite(e.logprob))
        tops.append(top)
    return {
        "tokens": [names.text(e.token_id) for e in entries],
        "token_logprobs": [None if e.logprob is None else finite(e.logprob) for e in entries],
        "top_logprobs": tops,
        "text_offset": [e.text_offset for e in entries],
    }


def chat_logprobs(entries: list[TokenLogprob], names: TokenText) -> dict[str, Any]:
    """Chat style: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": names.text(token_id), "logprob": finite(logprob),
                "bytes": names.bytes(token_id)}

    return {"content": [
        {**item(e.token_id, e.logprob or 0.0),
         "top_logprobs": [item(t, lp) for t, lp in e.top or ()]}
        for e in entries
    ]}


def prompt_logprobs(token_ids: tuple[int, ...], event: PromptLogprobs | None,
                    names: TokenText) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then per token a map from token id
    (as a string) to {logprob, rank, decoded_token}, holding the prompt's token and the top
    alternatives."""
    out: list[dict[str, dict[str, Any]] | None] = [None]
    if event is None:
        return out
    for i, token_id in enumerate(token_ids[1:]):
        entry = {str(t): {"logprob": finite(lp), "rank": r + 1, "decoded_token": names.text(t)}
                 for r, (t, lp) in enumerate(event.top[i])}
        if str(token_id) not in entry:
            entry[str(token_id)] = {"logprob": finite(event.logprobs[i]),
                                    "rank": event.ranks[i], "decoded_token": names.text(token_id)}
        out.append(entry)
    return out
