"""Executing a scheduled step: flatten the rows, run the model (from a CUDA graph when one is
captured for the step's shape), sample on the device; only sampled ids come back.

`launch` queues all of it on the device and returns at once; `Launched.result()` waits for the
ids. Tokens still PENDING on the host (sampled by the step before, still on the device with
overlapped steps) are read from that step's device output, so the host never waits for them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from openinfer_core.engine.batch import HostBatch, plan_batch
from openinfer_core.engine.cuda_graphs import CudaGraphRunner
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import Model
from openinfer_core.interfaces.scheduler import ScheduledRow, SchedulerOutput
from openinfer_core.sampling.sampler import SampledBatch, SampledToken, Sampler, SamplingRow


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

    def result(self) -> list[SampledToken]:
        """The sampled tokens, in sampling-row order; waits for the device."""
        return [] if self.sampled is None else self.sampled.result()


class ModelRunner:
    """Owns nothing but references: the model (with its KV buffer), the KV manager's block
    tables, and the sampler."""

    def __init__(self, model: Model, kv: KVManager, sampler: Sampler,
                 eos_token_ids: tuple[int, ...], graphs: CudaGraphRunner | None = None) -> None:
        self.model = model
        self.kv = kv
        self.sampler = sampler
        self.eos_token_ids = eos_token_ids
        self.graphs = graphs

    def execute(self, output: SchedulerOutput) -> list[SampledToken]:
        """Run one step and wait for its tokens."""
        return self.launch(output).result()

    @torch.inference_mode()
    def launch(self, output: SchedulerOutput, previous: Launched | None = None) -> Launched:
        """Queue the step on the device; `previous` is the step before it, if its tokens are
        still pending on the host."""
        host = plan_batch(output.rows, self.kv)
        fill = self._pending_inputs(host, output, previous)
        if self.graphs is not None and self.graphs.can_run(host):
            logits = self.graphs.run(host, fill)
        else:
            batch = host.to_device(self.model.device)
            if fill is not None:
                batch.input_ids.index_copy_(0, fill[0], fill[1])
            logits = self.model.forward(batch)
        rows = [self._sampling_row(r) for r in output.rows if r.samples]
        if not rows:
            return Launched(output, None, {})
        sample_rows = {r.seq.request_id: i
                       for i, r in enumerate(r for r in output.rows if r.samples)}
        return Launched(output, self.sampler.sample_async(logits, rows), sample_rows,
                        any(r.params.has_penalties for r in rows))

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
