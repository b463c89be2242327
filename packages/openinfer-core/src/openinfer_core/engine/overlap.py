"""The overlapped step loop: the host schedules and lays out step N+1 while the device runs
step N, so Python's share of a step hides behind the GPU's.

    batch    = scheduler.schedule()              # step N+1, while step N runs
    launched = runner.sample(runner.forward(batch, previous))  # queued; reads N's ids
    scheduler.launched(batch)                    # N+1's tokens count as computed
    scheduler.update(previous.output, previous.result())   # wait for N, emit its events

Step N's sampled ids never visit the host on their way into step N+1: `runner.forward` gathers
them on the device. The host learns them one step later, for events and stop checks, so a
request that stops at step N has had one more token computed in N+1 (thrown away), as in vLLM's
async scheduling and SGLang's overlap scheduler. A request whose pending token ends it whatever
it is (max_tokens, model length) is never scheduled past it. When a row of step N has sampling
penalties, which read the tokens so far on the host, step N is finished before N+1 is
scheduled. When a row of step N+1 follows a grammar, its forward is queued first, then step N
is finished (its tokens move the grammar on), and only then is N+1's sampling queued with the
grammar's mask: the host fills masks while the device runs N+1's forward."""

from __future__ import annotations

import logging
import traceback

from openinfer_core.engine.grammars_and_logprobs import GrammarsAndLogprobs
from openinfer_core.engine.runner import Launched, ModelRunner
from openinfer_core.events import TokenEvent
from openinfer_core.interfaces.model import ModelFailedError
from openinfer_core.interfaces.scheduler import Scheduler

log = logging.getLogger("openinfer")


class OverlappedLoop:
    """Holds the step in flight between calls. Engine thread only. (No reference back to the
    engine: a cycle would leave a dropped engine, CUDA graphs and all, to the cyclic garbage
    collector, which may run in the middle of another engine's graph capture.)"""

    def __init__(self, scheduler: Scheduler, runner: ModelRunner,
                 grammars: GrammarsAndLogprobs) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.grammars = grammars
        self.last_step_tokens = 0
        self._in_flight: Launched | None = None

    def has_work(self) -> bool:
        return self._in_flight is not None

    def step(self, events: list[TokenEvent]) -> list[TokenEvent]:
        """Schedule and launch the next step, then finish the one in flight; appends to and
        returns `events`."""
        previous, self._in_flight = self._in_flight, None
        if previous is not None and previous.needs_host_tokens:
            events.extend(self._finish(previous))
            previous = None
        batch = self.scheduler.schedule()
        self.last_step_tokens = batch.num_tokens
        events.extend(batch.events)
        if batch.rows:
            try:
                fwd = self.runner.forward(batch, previous)
                self.scheduler.launched(batch)
                mask = None
                if self.grammars.needs_mask(fwd):
                    if previous is not None:
                        events.extend(self._finish(previous))
                        previous = None
                    mask = self.grammars.token_mask(fwd)
                self._in_flight = self.runner.sample(fwd, mask)
            except ModelFailedError:
                raise  # no step can run any more: the engine stops (its users end every request)
            except Exception as exc:
                log.error("step failed: %s", traceback.format_exc())
                events.extend(self.scheduler.fail(batch, f"engine error: {exc!r}"))
        if previous is not None:
            events.extend(self._finish(previous))
        return events

    def _finish(self, launched: Launched) -> list[TokenEvent]:
        try:
            sampled = launched.result()
        except ModelFailedError:
            raise
        except Exception as exc:
            log.error("step failed: %s", traceback.format_exc())
            return self.scheduler.fail(launched.output, f"engine error: {exc!r}")
        events = self.scheduler.update(launched.output, sampled)
        self.grammars.finished(launched, events)
        return events
