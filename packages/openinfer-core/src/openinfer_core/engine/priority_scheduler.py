"""Priority scheduling (the built-in `priority` policy), with vLLM v1's semantics."""

from __future__ import annotations

from bisect import insort
from typing import ClassVar

from openinfer_core.engine.request_state import RequestState
from openinfer_core.engine.scheduler import FcfsScheduler


def priority_key(seq: RequestState) -> tuple[int, float]:
    """Lower sorts first: a lower `priority` value is served first, ties by arrival time."""
    return seq.request.priority, seq.request.arrival_time


class PriorityScheduler(FcfsScheduler):
    """`FcfsScheduler`'s loop with vLLM v1's priority policy (`--scheduling-policy priority`):

    - the waiting queue is kept sorted by (priority, arrival time), so admission takes the best
      first; equal keys keep queue order. Preempted requests go back by the same key (vLLM's
      `PriorityRequestQueue.prepend_request` is a plain heap push too);
    - when a running request cannot grow, the victim is the running request with the worst
      (highest) priority value, the latest arrival among equals, whether or not it already has
      a row this step (the row is taken back), and possibly the growing request itself.

    Like vLLM v1 (as merged in vllm-project/vllm#19057), priority only preempts for the growth
    of running requests: a higher-priority waiting request never evicts a running one, it waits
    for blocks or a `max_num_seqs` slot (vLLM issue #40004 proposes otherwise; not merged)."""

    honours_priority: ClassVar[bool] = True

    def _enqueue(self, seq: RequestState) -> None:
        insort(self.waiting, seq, key=priority_key)

    def _requeue(self, seq: RequestState) -> None:
        insort(self.waiting, seq, key=priority_key)

    def _victim(self) -> RequestState:
        # max() keeps the first of equals; scanning from the back makes that the latest admitted.
        return max(reversed(self.running), key=priority_key)
