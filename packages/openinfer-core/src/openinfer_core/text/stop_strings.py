"""Find stop strings in streamed text without ever emitting part of one."""

from __future__ import annotations

from collections.abc import Sequence

from openinfer_core.errors import InvalidParameterError


class StopStringMatcher:
    """Per-request filter between the detokenizer and the client. Not thread-safe.

    The stop string that completes first in the stream wins (on a tie, the longer one), so
    the result does not depend on how the text was cut into deltas.
    """

    def __init__(self, stop: Sequence[str], *, include_stop_str_in_output: bool = False) -> None:
        stops = [stop] if isinstance(stop, str) else list(stop)
        for s in stops:
            if not isinstance(s, str):
                raise InvalidParameterError(
                    "stop", f"stop strings must be strings, got {type(s).__name__}"
                )
            if not s:
                raise InvalidParameterError(
                    "stop", "stop strings must not be empty; remove the empty string"
                )
        self._stops = tuple(dict.fromkeys(stops))
        self._include = include_stop_str_in_output
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self._stopped = False
        self.matched: str | None = None  # the stop string that was hit

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add new text. Returns (text safe to emit now, whether a stop string was hit).

        After a hit, the output ends before the stop string (or right after it when
        include_stop_str_in_output); later calls return ("", True).
        """
        if self._stopped:
            return "", True
        if not self._stops:
            return delta, False
        text = self._held + delta
        hit = self._first_match(text)
        if hit is not None:
            start, end = hit
            self.matched = text[start:end]
            self._stopped = True
            self._held = ""
            return text[: end if self._include else start], True
        keep = self._partial_tail(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """The held-back text, for when generation ends without a stop string."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, int] | None:
        """(start, end) of the stop string that ends earliest in `text`."""
        best: tuple[int, int] | None = None
        for s in self._stops:
            start = text.find(s)
            if start < 0:
                continue
            end = start + len(s)
            if best is None or (end, start) < (best[1], best[0]):
                best = (start, end)
        return best

    def _partial_tail(self, text: str) -> int:
        """Length of the longest tail of `text` that some stop string begins with."""
        for size in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[len(text) - size :]
            if any(s.startswith(tail) for s in self._stops):
                return size
        return 0
