"""Turn a tiktoken rank file into a HuggingFace `tokenizers` byte-level BPE tokenizer.json.

tiktoken stores only `token bytes -> rank`; a rank doubles as the token id and as the merge
priority (lower merges first). The `tokenizers` BPE model wants an explicit merge list instead,
so we recover it: every way of cutting a token into two pieces that are themselves tokens is a
merge, and merges are ordered by the rank of the token they produce.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping, Set
from functools import cache
from typing import Any

from openinfer_core.errors import TokenizerError


def load_tiktoken_ranks(path: str | os.PathLike[str]) -> dict[bytes, int]:
    """Read a `.tiktoken` file: one `base64(token) rank` pair per line."""
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise TokenizerError(f"cannot read tiktoken rank file {path}: {e}") from e
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            encoded, rank = line.split()
            ranks[base64.b64decode(encoded, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as e:
            raise TokenizerError(
                f"{path}, line {lineno}: expected 'base64-token rank', got {line[:80]!r}; "
                "the file is not a tiktoken rank file or is damaged"
            ) from e
    return ranks


@cache
def byte_to_unicode() -> tuple[str, ...]:
    """The GPT-2 byte-level alphabet: each byte as one printable character.

    Bytes that are already visible Latin-1 characters stand for themselves; the rest (control
    characters, space, a few others) are moved, in order, to code points from U+0100 upward.
    """
    visible = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: list[str] = [""] * 256
    shifted = 0
    for b in range(256):
        if b in visible:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shifted)
            shifted += 1
    return tuple(table)


def bytes_to_byte_level(token: bytes, table: tuple[str, ...] | None = None) -> str:
    table = table or byte_to_unicode()
    return "".join([table[b] for b in token])


def recover_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """All (left, right) pairs whose concatenation is a token, in the order BPE should try them.

    Order: rank of the merged token, then rank of the left piece, then of the right piece.
    """
    found: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left = ranks.get(token[:cut])
            if left is None:
                continue
            right = ranks.get(token[cut:])
            if right is None:
                continue
            found.append((rank, left, right, token[:cut], token[cut:]))
    found.sort()
    return [(left_bytes, right_bytes) for _, _, _, left_bytes, right_bytes in found]


def tiktoken_to_tokenizer_json(
    ranks: Mapping[bytes, int],
    pattern: str,
    special_tokens: Mapping[str, int],
    *,
    not_special: Set[str] = frozenset(),
) -> dict[str, Any]:
    """Build the tokenizer.json content (as a dict) equivalent to a tiktoken encoding.

    `special_tokens` become added tokens, recognised whole anywhere in the text. Their
    `special` flag is true (so `skip_special_tokens` drops them) except for the names in
    `not_special`: markers such as `<think>` that are tokenized atomically but are part of
    the visible text.
    """
    unknown = set(not_special) - set(special_tokens)
    if unknown:
        raise ValueError(f"not_special names tokens that are not special tokens: {sorted(unknown)}")
    clashes = set(special_tokens.values()) & set(ranks.values())
    if clashes:
        raise ValueError(f"special token ids collide with BPE ranks: {sorted(clashes)[:5]}")

    table = byte_to_unicode()
    vocab = {bytes_to_byte_level(token, table): rank for token, rank in ranks.items()}
    if len(vocab) != len(ranks):
        raise ValueError("two BPE ranks map to the same byte-level string; the rank file is broken")
    # Byte-level strings never contain a plain space (0x20 maps to U+0120), so the classic
    # "left right" merge form is unambiguous and readable by every tokenizers version.
    merges = [
        f"{bytes_to_byte_level(left, table)} {bytes_to_byte_level(right, table)}"
        for left, right in recover_merges(ranks)
    ]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    added_tokens = [
        {
            "id": token_id,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": content not in not_special,
        }
        for content, token_id in sorted(special_tokens.items(), key=lambda item: item[1])
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            # tiktoken returns a whole pre-token directly when it is itself a token, without
            # running merges; ignore_merges is the same rule in `tokenizers`.
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }
