"""Finding markup tags in text that arrives in pieces."""

from __future__ import annotations


def undecided_tail(text: str, tag: str, *, with_space: bool = False) -> int:
    """Where the tail of `text` that must wait for more text begins: the longest suffix that is
    a proper prefix of `tag` (the tag may be arriving), and with `with_space` the whitespace
    right before it (markup may swallow the whitespace around it). `len(text)` when nothing
    has to wait. Assumes `tag` itself is not in `text`."""
    cut = len(text)
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            cut = len(text) - n
            break
    if with_space:
        cut = len(text[:cut].rstrip())
    return cut
