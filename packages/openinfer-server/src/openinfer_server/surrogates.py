"""Lone UTF-16 surrogates in request bodies.

JSON may spell one (`"\\ud800"`) and Python's json module decodes it into a `str` that is not
valid Unicode: the tokenizer refuses it with a TypeError and UTF-8 encoding (the engine's wire,
the response) fails. Request bodies are checked once, on arrival, so every field of every route
gets the same 400 naming it."""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_path(value: Any, path: str = "") -> str | None:
    """Where in a decoded JSON value the first string holding a surrogate is ('stop[1]',
    'messages[0].content'), or None when every string (keys included) is valid Unicode. The
    path itself is valid Unicode: a key's surrogates are written as escapes."""
    if isinstance(value, str):
        return path if _has_surrogate(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            bad_key = isinstance(key, str) and _has_surrogate(key)
            name = key.encode("utf-8", "backslashreplace").decode() if bad_key else str(key)
            where = f"{path}.{name}" if path else name
            if bad_key:
                return where
            if isinstance(item, str | dict | list):
                found = lone_surrogate_path(item, where)
                if found is not None:
                    return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            # Token-id prompts are long lists of ints: skip them without a call each.
            if isinstance(item, str | dict | list):
                found = lone_surrogate_path(item, f"{path}[{i}]")
                if found is not None:
                    return found
    return None


def _has_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None
