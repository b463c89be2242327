"""Prompt logprobs: which positions of a step a request wants them for, their computation on
the device from the same forward, and their collection into one event per request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from openinfer_core.events import Finished, PromptLogprobs, Token, TokenEvent, is_terminal
from openinfer_core.interfaces.scheduler import ScheduledRow


@dataclass(frozen=True, slots=True)
class Span:
    """`count` prompt tokens of a request from prompt index `first` (>= 1) on."""

    request_id: str
    first: int
    count: int
    top: int


@dataclass(frozen=True, slots=True)
class PromptLogprobPlan:
    flat: np.ndarray  # [Q] positions in the step whose logits predict a prompt token
    targets: np.ndarray  # [Q] that prompt token
    spans: tuple[Span, ...]

    @staticmethod
    def of(rows: Sequence[ScheduledRow], query_start_loc: np.ndarray) -> PromptLogprobPlan | None:
        """Before the step's `launched`: `num_computed_tokens` is where each row starts."""
        flat: list[np.ndarray] = []
        targets: list[Sequence[int]] = []
        spans: list[Span] = []
        for b, row in enumerate(rows):
            seq = row.seq
            top = seq.request.params.prompt_logprobs
            if top is None or seq.num_output_tokens:
                continue  # (with output, the prompt is recomputed after preemption: sent)
            lo = seq.num_computed_tokens
            # Position j's logits predict token j + 1; the last prompt position predicts the
            # first generated token, which is the sampler's.
            hi = min(lo + row.num_new_tokens, seq.num_prompt_tokens - 1)
            if hi <= lo:
                continue
            start = int(query_start_loc[b])
            flat.append(np.arange(start, start + hi - lo, dtype=np.int64))
            targets.append(seq.token_ids[lo + 1:hi + 1])
            spans.append(Span(seq.request_id, lo + 1, hi - lo, top))
        if not spans:
            return None
        return PromptLogprobPlan(np.concatenate(flat),
                                 np.fromiter((t for ts in targets for t in ts), np.int64),
                                 tuple(spans))


@dataclass(slots=True)
class PromptLogprobBatch:
    """A step's prompt logprobs, on their way to the host: logprob, rank, and top-N per
    position, packed in one float64 tensor."""

    plan: PromptLogprobPlan
    _host: torch.Tensor
    _event: torch.cuda.Event | None
    _n_max: int

    @classmethod
    def compute(cls, logits: torch.Tensor, plan: PromptLogprobPlan) -> PromptLogprobBatch:
        """`logits` [Q, V] are the plan's positions, in order."""
        logprobs = torch.log_softmax(logits.to(torch.float32), dim=-1)
        targets = torch.from_numpy(plan.targets).to(logits.device, non_blocking=True)
        chosen = logprobs.gather(1, targets.unsqueeze(1))
        rank = (logprobs > chosen).sum(dim=1) + 1
        n_max = min(max(s.top for s in plan.spans), logprobs.shape[-1])
        parts = [chosen.squeeze(1).double(), rank.double()]
        if n_max:
            vals, ids = logprobs.topk(n_max, dim=-1)
            parts += [vals.double().flatten(), ids.double().flatten()]
        packed = torch.cat(parts)
        if packed.device.type != "cuda":
            return cls(plan, packed, None, n_max)
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(plan, host, event, n_max)

    def result(self) -> list[tuple[Span, list[float], list[int], list[list[tuple[int, float]]]]]:
        if self._event is not None:
            self._event.synchronize()
        values: list[float] = self._host.tolist()
        q, n_max = len(self.plan.targets), self._n_max
        chosen, ranks = values[:q], values[q:2 * q]
        top_vals, top_ids = values[2 * q:2 * q + q * n_max], values[2 * q + q * n_max:]
        out = []
        at = 0
        for span in self.plan.spans:
            tops = [[(int(top_ids[(at + i) * n_max + r]), top_vals[(at + i) * n_max + r])
                     for r in range(span.top)] for i in range(span.count)]
            out.append((span, chosen[at:at + span.count],
                        [int(r) for r in ranks[at:at + span.count]], tops))
            at += span.count
        return out


class PromptLogprobCollector:
    """Gathers each request's prompt logprobs over its prefill chunks (each position once,
    however often preemption recomputes it) and emits them as one event, just before the
    request's first token or its end. Engine thread only."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[dict[int, tuple[float, int, tuple[tuple[int, float], ...]]],
                                    int]] = {}

    def add(self, batch: PromptLogprobBatch, prompt_lengths: dict[str, int]) -> None:
        for span, logprobs, ranks, tops in batch.result():
            got, _ = self._open.setdefault(
                span.request_id, ({}, prompt_lengths[span.request_id]))
            for i in range(span.count):
                got.setdefault(span.first + i, (logprobs[i], ranks[i], tuple(tops[i])))

    def emit(self, events: list[TokenEvent]) -> list[TokenEvent]:
        """`events` with each collected request's `PromptLogprobs` placed before its first
        token or its end."""
        if not self._open:
            return events
        out: list[TokenEvent] = []
        for event in events:
            entry = self._open.get(event.request_id)
            if entry is not None and (type(event) is Token or is_terminal(event)):
                del self._open[event.request_id]
                got, length = entry
                # Complete unless the request ended (aborted, failed) before its prompt did.
                if type(event) in (Token, Finished) and len(got) == length - 1:
                    items = [got[i] for i in range(1, length)]
                    out.append(PromptLogprobs(event.request_id, tuple(x[0] for x in items),
                                              tuple(x[1] for x in items),
                                              tuple(x[2] for x in items)))
            out.append(event)
        return out
