"""Executing a scheduled step: flatten the rows, run the model (from a CUDA graph when one is
captured for the step's shape), sample on the device; only sampled ids come back.

`launch` queues all of it on the device and returns at once; `Launched.result()` waits for the
ids. Tokens still PENDING on the host (sampled by the step before, still on the device with
overlapped steps) are read from that step's device output, so the host never waits for them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.cuda_graphs import CudaGraphRunner
from openinfer_core.engine.pooling import PooledBatch
from openinfer_core.engine.prompt_logprobs import PromptLogprobBatch, PromptLogprobPlan
from openinfer_core.interfaces.capabilities import supports_pooling
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import HostBatch, Model
from openinfer_core.interfaces.scheduler import ScheduledRow, SchedulerOutput
from openinfer_core.sampling.sampler import SampledBatch, SampledToken, Sampler, SamplingRow
from openinfer_core.sampling.token_mask import TokenMask


@dataclass(slots=True)
class Forwarded:
    """A step's forward queued on the device, its sampling not yet: `logits` [S, V] are the
    sampling rows' (valid until the next forward)."""

    output: SchedulerOutput
    logits: torch.Tensor
    prompt_logprobs: PromptLogprobBatch | None
    sampling_rows: list[ScheduledRow]
    # Taken before `Scheduler.launched` adds the step's PENDING slots.
    rows: list[SamplingRow]
    pooled: PooledBatch | None = None


@dataclass(slots=True)
class Launched:
    """A step queued on the device. `sample_rows` maps the request id of each sampling row to
    its index in `sampled` (where the next step finds its pending token)."""

    output: SchedulerOutput
    sampled: SampledBatch | None
    sample_rows: dict[str, int]
    # A row samples with penalties, which read its tokens so far on the host: the next step
    # must not be scheduled before this one's tokens are known.
    needs_host_tokens: bool = False
    prompt_logprobs: PromptLogprobBatch | None = None
    pooled: PooledBatch | None = None

    def result(self) -> list[SampledToken]:
        """The sampled tokens, in sampling-row order; waits for the device."""
        return [] if self.sampled is None else self.sampled.result()


class ModelRunner:
    """Owns nothing but references: the model (with its KV buffer), the KV manager's block
    tables, and the sampler."""

    def __init__(self, model: Model, kv: KVManager, sampler: Sampler,
                 eos_token_ids: tuple[int, ...], graphs: CudaGraphRunner | None = None, *,
                 pooling: bool = False) -> None:
        self.model = model
        self.kv = kv
        self.sampler = sampler
        self.eos_token_ids = eos_token_ids
        self.graphs = graphs
        # An engine with task `embed`: every step is of pooling requests (the engine refuses
        # the other kind), so a step need not look at its rows to know.
        self.pooling = pooling

    @torch.inference_mode()
    def forward(self, output: SchedulerOutput, previous: Launched | None = None) -> Forwarded:
        """Queue the step's forward (and its prompt logprobs) on the device; `previous` is the
        step before it, if its tokens are still pending on the host."""
        host = plan_batch(output.rows, self.kv)
        if self.pooling:
            return self._forward_pooling(host, output)
        fill = self._pending_inputs(host, output, previous)
        plan = PromptLogprobPlan.of(output.rows, host.query_start_loc)
        num_sampling = len(host.logits_indices)
        if plan is not None:
            host.logits_indices = np.concatenate([host.logits_indices, plan.flat])
        graphed = False
        if plan is None and self.graphs is not None:
            # A server under load never idles to capture its pending graphs: a step whose own
            # bucket is pending captures it first, rather than replay one up to twice its
            # size or run eagerly (each bucket once).
            self.graphs.capture_for(host)
            graphed = self.graphs.can_run(host)
        if graphed:
            assert self.graphs is not None
            logits = self.graphs.run(host, fill)
        else:
            batch = host.to_device(self.model.device)
            if fill is not None:
                batch.input_ids.index_copy_(0, fill[0], fill[1])
            logits = self.model.forward(batch)
        prompt = None
        if plan is not None:
            prompt = PromptLogprobBatch.compute(logits[num_sampling:], plan)
            logits = logits[:num_sampling]
        sampling_rows = [r for r in output.rows if r.samples]
        return Forwarded(output, logits, prompt, sampling_rows,
                         [self._sampling_row(r) for r in sampling_rows])

    @torch.inference_mode()
    def sample(self, fwd: Forwarded, token_mask: TokenMask | None = None) -> Launched:
        """Queue the sampling of a step whose forward is queued."""
        rows = fwd.rows
        if not rows:
            return Launched(fwd.output, None, {}, prompt_logprobs=fwd.prompt_logprobs,
                            pooled=fwd.pooled)
        sample_rows = {r.seq.request_id: i for i, r in enumerate(fwd.sampling_rows)}
        return Launched(fwd.output, self.sampler.sample_async(fwd.logits, rows, token_mask),
                        sample_rows, any(r.params.has_penalties for r in rows),
                        fwd.prompt_logprobs)

    def _forward_pooling(self, host: HostBatch, output: SchedulerOutput) -> Forwarded:
        """A step of pooling requests (an engine with task `embed` runs no other kind): the
        hidden states at the rows that complete their prompt, eagerly (graphs hold logits)."""
        if not supports_pooling(self.model):
            raise RuntimeError("pooling rows reached a model without SupportsPooling")
        if any(not r.seq.request.pooling for r in output.rows):
            raise RuntimeError("a step mixes pooling and generating requests")
        hidden = self.model.forward_hidden(host.to_device(self.model.device))
        done = tuple(r.seq.request_id for r in output.rows if r.samples)
        return Forwarded(output, hidden[:0], None, [], [], PooledBatch.copy(hidden, done))

    def _pending_inputs(self, host: HostBatch, output: SchedulerOutput,
                        previous: Launched | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(positions in the step, token ids) on the device for the step's PENDING tokens,
        gathered from the previous step's sampled ids."""
        where, rows = host.pending_tokens()
        if not len(where):
            return None
        if previous is None or previous.sampled is None:
            raise RuntimeError("a step has pending tokens but no step before it sampled")
        try:
            src = [previous.sample_rows[output.rows[b].seq.request_id] for b in rows.tolist()]
        except KeyError as exc:
            raise RuntimeError(f"pending token of request {exc} was not sampled by the step "
                               "before") from None
        index = torch.from_numpy(np.stack([where, np.asarray(src, dtype=np.int64)]))
        device = previous.sampled.token_ids.device
        if device.type == "cuda":
            index = index.pin_memory()
        index = index.to(device, non_blocking=True)
        return index[0], previous.sampled.token_ids[index[1]].to(torch.int64)

    def _sampling_row(self, row: ScheduledRow) -> SamplingRow:
        seq = row.seq
        params = seq.request.params
        banned: tuple[int, ...] = ()
        if seq.num_output_tokens < params.min_tokens:
            # Stop ids may not end the request before min_tokens; forbid them until then.
            banned = params.stop_token_ids + (() if params.ignore_eos else self.eos_token_ids)
        return SamplingRow(params, seq.prompt_token_ids, seq.output_token_ids, banned)
