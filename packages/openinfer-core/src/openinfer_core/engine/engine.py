"""The engine: one thread owns the device and runs schedule -> execute -> update."""

from __future__ import annotations

import logging
import queue
import time
import traceback
from pathlib import Path

from openinfer_core.cpu_threads import share_cores
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.grammars_and_logprobs import GrammarsAndLogprobs
from openinfer_core.engine.overlap import OverlappedLoop
from openinfer_core.engine.runner import ModelRunner
from openinfer_core.errors import InvalidParameterError, ModelConfigError
from openinfer_core.events import Rejected, TokenEvent
from openinfer_core.handle import LoadSnapshot, ModelInfo
from openinfer_core.interfaces.capabilities import (
    sampling_kernels_of,
    supports_close,
    supports_offload,
    supports_pooling,
)
from openinfer_core.interfaces.model import ModelFailedError
from openinfer_core.interfaces.scheduler import Scheduler, SchedulerConfig
from openinfer_core.plugins import PluginManager, get_plugin_manager
from openinfer_core.request import GenerateRequest
from openinfer_core.sampling.sampler import Sampler
from openinfer_core.startup.bring_up import bring_up
from openinfer_core.startup.host_memory import release_host_memory

log = logging.getLogger("openinfer")

RESTORE_POLL_S = 0.0002


class Engine:
    """Synchronous core. `add_request` and `abort` may be called from any thread (they only
    enqueue); `step` must always be called from the same thread.

    `defer_graphs`: capture only the CUDA graphs a start needs most and leave the rest to
    `idle_work` (the engine process's loop calls it when idle); off, every graph is captured
    here, as offline users (`LLM`, the benchmarks) that never call `idle_work` need."""

    def __init__(self, config: EngineConfig, plugins: PluginManager | None = None, *,
                 defer_graphs: bool = False) -> None:
        self.config = config
        if config.data_parallel_size != 1:  # replicas are engine processes behind a router
            raise InvalidParameterError(
                "data_parallel_size", f"is {config.data_parallel_size}: one Engine is one "
                "replica; `openinfer serve --data-parallel-size N` runs N behind one API")
        plugins = plugins or get_plugin_manager()
        # The scheduler is checked before the long start-up, so a wrong choice fails at once.
        scheduler_cls = plugins.registries.schedulers.resolve(config.scheduler)
        if config.kv_offload and not supports_offload(scheduler_cls):
            raise ModelConfigError(f"--kv-offload: scheduler {config.scheduler!r} cannot "
                                   "restore offloaded prefixes (it lacks "
                                   "capabilities.SupportsOffload)")
        if config.torch_device().type == "cpu":
            share_cores(config.cpu_processes())
        started = bring_up(config, plugins, defer_graphs=defer_graphs)
        self.model, self.kv, self.graphs = started.model, started.kv, started.graphs
        self.eos_token_ids = started.eos_token_ids
        self.hf_config = started.hf_config
        self.startup_seconds = started.seconds  # for benchmarks/device/startup.py
        self._host_memory_released = False  # by the first `idle_work`, after ready
        self.scheduler: Scheduler = scheduler_cls(SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.model.max_model_len,
            eos_token_ids=self.eos_token_ids,
        ), self.kv)
        self.offload = started.offload
        if self.offload is not None:
            assert supports_offload(self.scheduler)  # its class was checked before start-up
            self.scheduler.attach_offload(self.offload)
        sampler = Sampler(self.model.vocab_size, seed=config.seed,
                          kernels=sampling_kernels_of(self.model))
        self.pooling = config.serves_embeddings()
        self.runner = ModelRunner(self.model, self.kv, sampler, self.eos_token_ids, self.graphs,
                                  pooling=self.pooling)
        hidden = 0
        if self.pooling:
            if not supports_pooling(self.model):
                raise ModelConfigError(
                    f"task embed: model {config.model!r} cannot return hidden states (its "
                    "model line lacks capabilities.SupportsPooling)")
            hidden = self.model.pooling_hidden_size
        self.model_info = ModelInfo(
            name=config.model, max_model_len=self.model.max_model_len,
            kv_total_blocks=self.kv.num_total_blocks, kv_block_size=self.kv.block_size,
            eos_token_ids=self.eos_token_ids, task="embed" if self.pooling else "generate",
            hidden_size=hidden)
        self._inbox: queue.SimpleQueue[GenerateRequest | str] = queue.SimpleQueue()
        self._last_step_tokens = 0
        self._grammars = GrammarsAndLogprobs(Path(config.model), self.model.vocab_size,
                                             self.eos_token_ids)
        self._overlap: OverlappedLoop | None = None
        if config.async_scheduling:
            self._overlap = OverlappedLoop(self.scheduler, self.runner, self._grammars)

    @property
    def last_step_tokens(self) -> int:
        """Tokens the last step scheduled (for benchmarks)."""
        if self._overlap is not None:
            return self._overlap.last_step_tokens
        return self._last_step_tokens

    @property
    def overlapped(self) -> bool:
        """Whether steps overlap (`EngineConfig.async_scheduling`)."""
        return self._overlap is not None

    def idle_work(self) -> bool:
        """Work for an idle engine (no step in flight, none waiting): first give the host
        memory that loading left behind back, then capture the pending CUDA graphs, one per
        call. Whether more is left; the caller polls for requests in between, so a request
        waits at most one capture. Engine thread."""
        if self.has_work():
            return False
        if not self._host_memory_released:
            self._host_memory_released = True
            release_host_memory()
            return self.graphs is not None and bool(self.graphs.pending)
        if self.graphs is None:
            return False
        if not self.graphs.pending:
            if self.graphs.captured_under_load:  # what the steps' captures left
                self.graphs.captured_under_load = False
                release_host_memory()
            return False
        more = self.graphs.capture_next()
        if not more:
            self.graphs.captured_under_load = False
            release_host_memory()  # what the captures left
        return more

    # -- any thread ----------------------------------------------------------------------
    def add_request(self, request: GenerateRequest) -> None:
        self._inbox.put(request)

    def abort(self, request_id: str) -> None:
        self._inbox.put(request_id)

    # -- engine thread -------------------------------------------------------------------
    def has_work(self) -> bool:
        return (not self._inbox.empty() or self.scheduler.has_work() or self._grammars.holding()
                or (self._overlap is not None and self._overlap.has_work())
                or (self.offload is not None and self.offload.busy()))

    def snapshot(self) -> LoadSnapshot:
        return self.scheduler.snapshot()

    def step(self) -> list[TokenEvent]:
        """One iteration of the loop; returns the events it produced, in order. With
        overlapped steps (overlap.py) an iteration launches one step and finishes the one
        before; otherwise it is the plain loop below."""
        events = self._drain_inbox()
        ready, refused = self._grammars.release()
        for request in ready:
            self.scheduler.add(request)
        events.extend(refused)
        if self._overlap is not None:
            events = self._overlap.step(events)
        else:
            self._plain_step(events)
        if self.offload is not None:
            self.offload.after_step()
            if not events and self.last_step_tokens == 0 and self.offload.waiting():
                time.sleep(RESTORE_POLL_S)  # only restores in flight: do not spin on them
        if not events and not self.scheduler.has_work() and self._grammars.holding():
            self._grammars.idle_wait()  # only grammars compiling: do not spin
        return self._grammars.emit(events)

    def close(self) -> None:
        """Let the offload tiers finish their copies and writes, then stop what the model
        started (tensor-parallel workers). Engine thread, or after it stopped."""
        if self.offload is not None:
            self.offload.close()
        if self.graphs is not None:  # before the model: a tensor-parallel group outlives them
            self.graphs.release()
        if supports_close(self.model):
            self.model.close()

    def _plain_step(self, events: list[TokenEvent]) -> None:
        batch = self.scheduler.schedule()
        self._last_step_tokens = batch.num_tokens
        events.extend(batch.events)
        if not batch.rows:
            return
        try:
            fwd = self.runner.forward(batch)
            launched = self.runner.sample(fwd, self._grammars.token_mask(fwd))
            sampled = launched.result()
        except ModelFailedError:
            raise  # no step can run any more: the engine stops (its users end every request)
        except Exception as exc:
            # The batch fails, the engine lives: every request in it gets Error.
            log.error("step failed: %s", traceback.format_exc())
            events.extend(self.scheduler.fail(batch, f"engine error: {exc!r}"))
            return
        update = self.scheduler.update(batch, sampled)
        self._grammars.finished(launched, update)
        events.extend(update)

    def _drain_inbox(self) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return events
            if isinstance(item, str):
                events.extend(self._grammars.abort(item) or self.scheduler.abort(item))
            elif item.pooling != self.pooling:
                events.append(Rejected(item.request_id, (
                    "this engine serves embeddings (task embed): it takes pooling requests "
                    "only" if self.pooling else "this engine generates (task generate): start "
                    "it with task embed for pooling requests")))
            elif (top := max(item.prompt_token_ids)) >= (vocab := self.model.vocab_size):
                events.append(Rejected(item.request_id, (
                    f"prompt token id {top} is out of range: the model's vocabulary has "
                    f"{vocab} tokens (ids 0..{vocab - 1})")))
            elif not self._grammars.hold(item):
                self.scheduler.add(item)
