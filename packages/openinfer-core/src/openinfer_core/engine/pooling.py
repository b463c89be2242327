"""Pooling requests (`GenerateRequest.pooling`): their hidden states, taken on the device from
the step's forward, brought to the host, and placed as an `Embedding` before each request's
`Finished`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openinfer_core.events import Embedding, Finished, TokenEvent


@dataclass(slots=True)
class PooledBatch:
    """A step's pooled vectors on their way to the host: row i is `request_ids[i]`'s."""

    request_ids: tuple[str, ...]
    _host: torch.Tensor
    _event: torch.cuda.Event | None

    @classmethod
    def copy(cls, hidden: torch.Tensor, request_ids: tuple[str, ...]) -> PooledBatch:
        """`hidden` [S, H]: the final-normed hidden states at the rows' last prompt tokens."""
        hidden = hidden.to(torch.float32)
        if hidden.device.type != "cuda":
            return cls(request_ids, hidden, None)
        host = torch.empty(hidden.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(hidden, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(request_ids, host, event)

    def result(self) -> dict[str, tuple[float, ...]]:
        """Each request's vector; waits for the copy."""
        if self._event is not None:
            self._event.synchronize()
        return {rid: tuple(row) for rid, row in zip(self.request_ids, self._host.tolist(),
                                                    strict=True)}


def place_embeddings(pooled: PooledBatch, events: list[TokenEvent]) -> None:
    """Put each pooled request's `Embedding` just before its `Finished` in `events` (in
    place). A request aborted or failed while its step ran has no `Finished` here and gets
    none."""
    vectors = pooled.result()
    out: list[TokenEvent] = []
    for event in events:
        if type(event) is Finished and event.request_id in vectors:
            out.append(Embedding(event.request_id, vectors[event.request_id]))
        out.append(event)
    events[:] = out
