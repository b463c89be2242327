"""First-come-first-served scheduling by token budget (the built-in `fcfs` policy)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from openinfer_core.engine.request_state import PENDING, RequestState, RequestStatus
from openinfer_core.events import (
    Error,
    Finished,
    FinishReason,
    Rejected,
    Scheduled,
    Token,
    TokenEvent,
)
from openinfer_core.handle import LoadSnapshot
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.scheduler import ScheduledRow, SchedulerConfig, SchedulerOutput
from openinfer_core.request import GenerateRequest
from openinfer_core.sampling.sampler import SampledToken

if TYPE_CHECKING:
    from openinfer_core.interfaces.offload import Loading, PrefixRestorer

# Prompt tokens per step of a request that wants prompt logprobs: each one's logits row is kept
# (vocab-wide, fp32), so a long prompt goes in chunks of this many.
PROMPT_LOGPROBS_CHUNK = 512


class FcfsScheduler:
    """Running requests first (decodes and unfinished prefill chunks), then waiting ones in
    arrival order, while the step's token budget and `max_num_seqs` allow. A request is admitted
    only when its chunk's KV blocks can be had; when a running request cannot grow, the most
    recently admitted one is preempted (its KV freed, recomputed later with its tokens kept).

    Subclasses change the policy, not the loop: `_enqueue` (where a new request waits),
    `_requeue` (where a preempted one waits) and `_victim` (whom growth preempts)."""

    # Whether `GenerateRequest.priority` means anything here; when not, a non-zero priority is
    # refused rather than silently ignored (vLLM does the same).
    honours_priority: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig, kv: KVManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        # Running requests whose last token is on the device and ends them (max_tokens or the
        # model length): not scheduled again, finished by the update that sees the token.
        self.finishing: list[RequestState] = []
        self.num_preemptions = 0
        self._refused: list[TokenEvent] = []  # Rejected at add(), emitted by the next schedule()
        self.offload: PrefixRestorer | None = None  # `attach_offload`, under --kv-offload
        # Requests whose prefix is coming back from an offload tier (engine/offload.py).
        self.loading: list[Loading] = []

    def attach_offload(self, offload: PrefixRestorer) -> None:
        """Restore prefixes from the offload tiers at admission (`capabilities.SupportsOffload`)."""
        self.offload = offload

    # -- policy ----------------------------------------------------------------------------
    def _enqueue(self, seq: RequestState) -> None:
        self.waiting.append(seq)

    def _requeue(self, seq: RequestState) -> None:
        self.waiting.appendleft(seq)

    def _victim(self) -> RequestState:
        return self.running[-1]

    # -- queue ---------------------------------------------------------------------------
    def add(self, request: GenerateRequest) -> None:
        seq = RequestState.from_request(request)
        reason = self._refusal(seq)
        if reason:
            seq.status = RequestStatus.FINISHED
            self._refused.append(Rejected(seq.request_id, reason))
        else:
            self._enqueue(seq)

    def abort(self, request_id: str) -> list[TokenEvent]:
        for loading in self.loading:
            seq = loading.seq
            if seq.request_id == request_id and not loading.aborted:
                # Its blocks stay held until the copy into them is ready (`_finish_loads`).
                loading.aborted = True
                seq.status = RequestStatus.FINISHED
                return [Finished(request_id, FinishReason.ABORT, seq.num_prompt_tokens, 0)]
        for queue in (self.running, self.finishing, self.waiting):
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self._truncate(seq, seq.num_settled_tokens)
                    return [self._finish(seq, FinishReason.ABORT)]
        return []

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.finishing or self._refused
                    or self.loading)

    def snapshot(self) -> LoadSnapshot:
        return LoadSnapshot(len(self.running) + len(self.finishing),
                            len(self.waiting) + len(self.loading),
                            self.kv.num_used_blocks, self.kv.num_total_blocks,
                            self.kv.prefix_cache_stats, self.num_preemptions,
                            self.offload.stats() if self.offload is not None else None)

    # -- schedule ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(events=self._refused)
        self._refused = []
        if self.loading:
            self._finish_loads()
        budget, preempted = self._schedule_running(out)
        if not preempted:  # admitting while requests are being preempted would only thrash
            self._admit_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput) -> tuple[int, bool]:
        """Rows for running requests; returns the budget left and whether any was preempted."""
        budget = self.config.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq, budget)
            if self.kv.allocate(seq.request_id, seq.num_computed_tokens + n):
                out.rows.append(self._row(seq, n))
                budget -= n
                i += 1
                continue
            preempted = True
            victim = self._victim()
            j = self.running.index(victim)
            del self.running[j]
            self._preempt(victim)
            if j < i:  # it already has a row this step: take the row and its tokens back
                budget += self._unschedule(out, victim)
                i -= 1
            # j == i: seq itself went; running[i] is the next one now
        return budget, preempted

    def _finish_loads(self) -> None:
        """Requests whose restore landed go back to the head of the queue."""
        assert self.offload is not None
        # Only for a request that is alone would nothing else wait on its copy.
        chain = len(self.loading) == 1 and not (self.running or self.finishing or self.waiting)
        still: list[Loading] = []
        for loading in self.loading:
            if not self.offload.finish_load(loading, chain):
                still.append(loading)
            elif not loading.aborted:
                loading.seq.status = RequestStatus.WAITING
                self._requeue(loading.seq)
        self.loading = still

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            # Cached prompt positions come without their logprobs: recompute them.
            wants_logprobs = seq.request.params.prompt_logprobs is not None
            hit = 0 if wants_logprobs else self.kv.computed_tokens(seq.request_id, seq.token_ids)
            if self.offload is not None and not seq.offload_probed and not wants_logprobs:
                loading = self.offload.start_load(seq)
                if loading is not None:  # it waits in `loading`; the next one may be admitted
                    self.waiting.popleft()
                    self.loading.append(loading)
                    continue
            seq.num_computed_tokens = seq.num_cached_tokens = hit
            n = self._chunk(seq, budget)
            if not self.kv.allocate(seq.request_id, seq.num_computed_tokens + n):
                # A waiting request holds no KV (not even prefix-cache hits), so no request can
                # ever wait on blocks held by one that waits.
                self.kv.free(seq.request_id)
                seq.num_computed_tokens = 0
                break  # wait for blocks; the rest of the queue waits behind it
            self.waiting.popleft()
            seq.status = RequestStatus.RUNNING
            self.running.append(seq)
            if not seq.announced:
                seq.announced = True
                out.events.append(Scheduled(seq.request_id, seq.num_prompt_tokens,
                                            seq.num_cached_tokens))
            out.rows.append(self._row(seq, n))
            budget -= n

    @staticmethod
    def _unschedule(out: SchedulerOutput, seq: RequestState) -> int:
        """Drop `seq`'s row from this step; returns its tokens to the budget."""
        row = next(r for r in out.rows if r.seq is seq)
        out.rows.remove(row)
        return row.num_new_tokens

    @staticmethod
    def _chunk(seq: RequestState, budget: int) -> int:
        """Tokens `seq` runs this step: all it has left, within the budget."""
        n = min(seq.num_tokens - seq.num_computed_tokens, budget)
        if seq.request.params.prompt_logprobs is not None \
                and seq.num_computed_tokens < seq.num_prompt_tokens:
            n = min(n, PROMPT_LOGPROBS_CHUNK)
        return n

    def _row(self, seq: RequestState, n: int) -> ScheduledRow:
        return ScheduledRow(seq, n, seq.num_computed_tokens + n == seq.num_tokens)

    def _preempt(self, seq: RequestState) -> None:
        self.kv.free(seq.request_id, seq.token_ids)
        seq.num_computed_tokens = 0
        seq.status = RequestStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._requeue(seq)

    def _refusal(self, seq: RequestState) -> str | None:
        priority = seq.request.priority
        if priority != 0 and not self.honours_priority:
            return (f"priority {priority} needs priority scheduling, which is not enabled: "
                    f"start the server with --scheduler priority "
                    f"(EngineConfig(scheduler='priority'))")
        prompt = seq.num_prompt_tokens
        max_tokens = 0 if seq.request.pooling else seq.request.max_tokens
        limit = self.config.max_model_len
        if seq.request.pooling and prompt > limit:
            return (f"input ({prompt} tokens) exceeds the maximum model length of {limit} "
                    "tokens")
        if prompt + max_tokens > limit:
            return (f"prompt ({prompt} tokens) + max_tokens ({max_tokens}) = "
                    f"{prompt + max_tokens} exceeds the maximum model length of {limit} tokens")
        block = self.kv.block_size
        need = -(-(prompt + max_tokens) // block)
        if need > self.kv.num_total_blocks:
            return (f"request needs {need} KV blocks ({prompt + max_tokens} tokens) but the "
                    f"whole KV cache holds {self.kv.num_total_blocks} blocks of {block} tokens")
        return None

    # -- after launch --------------------------------------------------------------------
    def launched(self, output: SchedulerOutput) -> None:
        if output.launched:
            return
        output.launched = True
        limit = self.config.max_model_len
        ending: list[RequestState] = []
        for row in output.rows:
            seq = row.seq
            seq.num_computed_tokens += row.num_new_tokens
            # Blocks this step fills can serve prefix hits from the next step on: any reader
            # runs after this step on the device. A block holding a PENDING token waits for
            # `update`.
            self.kv.cache_blocks(seq.request_id, seq.token_ids,
                                 min(seq.num_computed_tokens, seq.num_settled_tokens))
            if not row.samples:
                continue
            if seq.request.pooling:  # its prompt is done: no token, ended by `update`
                ending.append(seq)
                continue
            output.pending.append(len(seq.token_ids))
            seq.token_ids.append(PENDING)
            if seq.num_output_tokens >= seq.request.params.max_tokens or seq.num_tokens >= limit:
                ending.append(seq)  # ends with this token, whichever it is: not scheduled again
        if ending:
            leaving = set(ending)
            self.running = [s for s in self.running if s not in leaving]
            self.finishing.extend(ending)

    # -- update --------------------------------------------------------------------------
    def update(self, output: SchedulerOutput, sampled: Sequence[SampledToken]) -> list[TokenEvent]:
        self.launched(output)
        if len(sampled) != len(output.pending):
            raise RuntimeError(f"{len(sampled)} sampled tokens for {len(output.pending)} "
                               "sampling rows")
        events: list[TokenEvent] = []
        ended: set[RequestState] = set()
        samples = iter(zip(output.pending, sampled, strict=True))
        for row in output.rows:
            seq = row.seq
            if row.samples and seq.request.pooling:
                if seq.status is not RequestStatus.FINISHED:
                    events.append(self._end(seq, FinishReason.STOP, ended))
                continue
            if row.samples:
                index, tok = next(samples)
                if seq.status is not RequestStatus.FINISHED:
                    events.extend(self._append(seq, index, tok, ended))
            if seq.status is RequestStatus.RUNNING:
                self.kv.cache_blocks(seq.request_id, seq.token_ids,
                                     min(seq.num_computed_tokens, len(seq.token_ids)))
        if ended:
            self.running = [s for s in self.running if s not in ended]
            self.finishing = [s for s in self.finishing if s not in ended]
        return events

    def _append(self, seq: RequestState, index: int, tok: SampledToken,
                ended: set[RequestState]) -> list[TokenEvent]:
        """Put the token sampled for position `index` in place of its PENDING slot."""
        params = seq.request.params
        token_id = tok.token_id
        stops = token_id in params.stop_token_ids or (
            not params.ignore_eos and token_id in self.config.eos_token_ids)
        if stops and index - seq.num_prompt_tokens >= params.min_tokens:
            self._truncate(seq, index)
            return [self._end(seq, FinishReason.STOP, ended, stop_token_id=token_id)]
        seq.token_ids[index] = token_id
        events: list[TokenEvent] = [
            Token(seq.request_id, token_id, tok.logprob, tok.top_logprobs)]
        if index + 1 - seq.num_prompt_tokens >= params.max_tokens \
                or index + 1 >= self.config.max_model_len:
            self._truncate(seq, index + 1)
            events.append(self._end(seq, FinishReason.LENGTH, ended))
        return events

    @staticmethod
    def _truncate(seq: RequestState, length: int) -> None:
        """Drop tokens from `length` on (a stop token, and any step scheduled past it)."""
        del seq.token_ids[length:]
        seq.num_computed_tokens = min(seq.num_computed_tokens, length)

    def _end(self, seq: RequestState, reason: FinishReason, ended: set[RequestState],
             stop_token_id: int | None = None) -> Finished:
        if seq.status is RequestStatus.WAITING:  # preempted while its last step ran
            self.waiting.remove(seq)
        else:
            ended.add(seq)
        return self._finish(seq, reason, stop_token_id)

    def _finish(self, seq: RequestState, reason: FinishReason,
                stop_token_id: int | None = None) -> Finished:
        self.kv.free(seq.request_id, seq.token_ids)
        seq.status = RequestStatus.FINISHED
        return Finished(seq.request_id, reason, seq.num_prompt_tokens, seq.num_output_tokens,
                        stop_token_id)

    def fail(self, output: SchedulerOutput, message: str) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        for row in output.rows:
            seq = row.seq
            if seq.status is RequestStatus.FINISHED:
                continue
            for queue in (self.running, self.finishing, self.waiting):
                if seq in queue:
                    queue.remove(seq)
            self.kv.free(seq.request_id)
            seq.status = RequestStatus.FINISHED
            events.append(Error(seq.request_id, message))
        return events
