"""Work beside the current stream: a decode step's small kernels wait on each other's latency
more than on the GPU's bandwidth, so a branch of the step that the next few kernels do not read
(a shared expert beside the router, a cache write beside the query path) may run on a second
stream while they do, and be waited for only where its output is read.

`beside(fn, *args)` forks: the side stream first waits for everything issued so far on the
current stream, runs `fn` there, and records an event; `wait_for(event)` joins, on the
current stream, before the first kernel that reads the output. Both are recorded into a CUDA
graph under capture as the graph's fork and join edges. The caller must not touch what `fn`
reads or writes on the current stream between the two, and must make on the current stream,
before forking, anything lazily cached that both sides use (else the side would make it).

The side stream's kernels get arrival counts of their own (`split_k.lane`): two split
launches that overlap must not share them. Off the GPU, or with the side stream off,
`beside` calls `fn` in place and returns no event, and `wait_for(None)` does nothing, so a
caller has one code path."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from openinfer_kernels import split_k

T = TypeVar("T")

_streams: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream of a CUDA device, made on first use."""
    stream = _streams.get(device)
    if stream is None:
        stream = _streams[device] = torch.cuda.Stream(device)
    return stream


def beside(on: bool, device: torch.device, fn: Callable[..., T], *args: object,
           **kwargs: object) -> tuple[T, torch.cuda.Event | None]:
    """(fn(*args, **kwargs), the event that marks its end) with `fn` run on `device`'s side
    stream, forked from the current one; where `on` is False or the device is not CUDA,
    fn's result with no event (it ran in place)."""
    if not on or device.type != "cuda":
        return fn(*args, **kwargs), None
    main = torch.cuda.current_stream(device)
    side = side_stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side), split_k.lane(1):
        out = fn(*args, **kwargs)
        done = torch.cuda.Event()
        done.record(side)
    return out, done


def wait_for(event: torch.cuda.Event | None) -> None:
    """The current stream waits for `event` (a `beside` branch's end); None: nothing to wait
    for."""
    if event is not None:
        torch.cuda.current_stream().wait_event(event)
