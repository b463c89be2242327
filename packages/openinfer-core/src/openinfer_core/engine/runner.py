"""Executing a scheduled step: flatten the rows, run the model (decode from a CUDA graph when
one is captured for the batch size), sample on the device; only sampled ids come back."""

from __future__ import annotations

import torch

from openinfer_core.engine.batch import plan_batch
from openinfer_core.engine.cuda_graphs import CudaGraphRunner
from openinfer_core.interfaces.kv import KVManager
from openinfer_core.interfaces.model import Model
from openinfer_core.interfaces.scheduler import ScheduledRow, SchedulerOutput
from openinfer_core.sampling.sampler import SampledToken, Sampler, SamplingRow


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

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> list[SampledToken]:
        host = plan_batch(output.rows, self.kv)
        if self.graphs is not None and self.graphs.can_run(host):
            logits = self.graphs.run(host)
        else:
            logits = self.model.forward(host.to_device(self.model.device))
        rows = [self._sampling_row(r) for r in output.rows if r.samples]
        if not rows:
            return []
        return self.sampler.sample(logits, rows)

    def _sampling_row(self, row: ScheduledRow) -> SamplingRow:
        seq = row.seq
        params = seq.request.params
        banned: tuple[int, ...] = ()
        if seq.num_output_tokens < params.min_tokens:
            # Stop ids may not end the request before min_tokens; forbid them until then.
            banned = params.stop_token_ids + (() if params.ignore_eos else self.eos_token_ids)
        return SamplingRow(params, seq.prompt_token_ids, seq.output_token_ids, banned)
