"""`TokenizerThreads.run_for`: a small request's work runs on the event loop (no thread hop
to wait on the GIL for), a large or unsized one's on a worker thread."""

from __future__ import annotations

import asyncio
import threading

import pytest
from starlette.requests import Request

from openinfer_server.tokenizer_threads import INLINE_MAX_BYTES, TokenizerThreads


def _request(headers: dict[str, str]) -> Request:
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


@pytest.mark.parametrize(("headers", "inline"), [
    ({"content-length": "900"}, True),
    ({"content-length": str(INLINE_MAX_BYTES)}, True),
    ({"content-length": str(INLINE_MAX_BYTES + 1)}, False),
    ({}, False),  # chunked: its size is not known up front
    ({"content-length": "junk"}, False),
])
def test_small_bodies_run_on_the_loop(headers: dict[str, str], inline: bool) -> None:
    threads = TokenizerThreads(2)

    async def where() -> bool:
        loop_thread = threading.get_ident()
        ran_on = await threads.run_for(_request(headers), threading.get_ident)
        return ran_on == loop_thread

    try:
        assert asyncio.run(where()) is inline
    finally:
        threads.close()


def test_errors_come_back_either_way() -> None:
    threads = TokenizerThreads(1)

    def boom(size: int) -> None:
        raise ValueError(f"bad {size}")

    async def both() -> None:
        for length in (10, INLINE_MAX_BYTES * 2):
            with pytest.raises(ValueError, match=f"bad {length}"):
                await threads.run_for(_request({"content-length": str(length)}), boom, length)

    try:
        asyncio.run(both())
    finally:
        threads.close()
