"""The engine's structured-output requests: grammars compiled off the step loop, matchers
advanced by the tokens the engine emits, and each step's bitmask for the rows that sample."""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import llguidance
import torch

from openinfer_core.errors import InvalidParameterError
from openinfer_core.events import Rejected, Token, TokenEvent
from openinfer_core.interfaces.scheduler import ScheduledRow
from openinfer_core.request import GenerateRequest
from openinfer_core.sampling.token_mask import TokenMask
from openinfer_core.structured.grammar import GrammarCompiler

log = logging.getLogger("openinfer")

# Rows whose masks are filled by llguidance's thread pool rather than one by one.
PARALLEL_FILL_ROWS = 4


class StructuredOutputs:
    """Engine thread only, except the compiles, which run on a small thread pool: a request
    with a grammar reaches the scheduler once its grammar is compiled, so a slow compile
    holds back that request alone."""

    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._model_dir = model_dir
        self._vocab_size = vocab_size
        self._eos = tuple(eos_token_ids)
        self._compiler: cf.Future[GrammarCompiler] | None = None
        self._pool = cf.ThreadPoolExecutor(2, thread_name_prefix="openinfer-grammar")
        self._compiling: dict[str, tuple[GenerateRequest, cf.Future[llguidance.LLMatcher]]] = {}
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._executor: llguidance.LLExecutor | None = None

    def __del__(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- requests -----------------------------------------------------------------------
    def submit(self, request: GenerateRequest) -> None:
        """Start compiling the request's grammar; `ready()` hands the request back."""
        spec = request.params.structured
        assert spec is not None
        if self._compiler is None:
            self._compiler = self._pool.submit(self._make_compiler)
        compiler = self._compiler
        self._compiling[request.request_id] = (
            request, self._pool.submit(lambda: compiler.result().compile(spec)))

    def _make_compiler(self) -> GrammarCompiler:
        path = self._model_dir / "tokenizer.json"
        if not path.is_file():
            raise InvalidParameterError(
                "response_format", f"structured output needs the model's tokenizer.json, "
                f"which {self._model_dir} does not have")
        return GrammarCompiler(path.read_text(), self._vocab_size, self._eos)

    def abort(self, request_id: str) -> GenerateRequest | None:
        """Drop a request still compiling; returns it (it never reached the scheduler)."""
        entry = self._compiling.pop(request_id, None)
        return None if entry is None else entry[0]

    def compiling(self) -> bool:
        return bool(self._compiling)

    def wait(self, timeout: float) -> None:
        """Block until a compile finishes or `timeout` seconds pass (nothing else to do)."""
        cf.wait([f for _, f in self._compiling.values()], timeout,
                return_when=cf.FIRST_COMPLETED)

    def ready(self) -> tuple[list[GenerateRequest], list[TokenEvent]]:
        """Requests whose grammar is compiled, and `Rejected` for those that failed."""
        done = [rid for rid, (_, f) in self._compiling.items() if f.done()]
        requests: list[GenerateRequest] = []
        refused: list[TokenEvent] = []
        for rid in done:
            request, future = self._compiling.pop(rid)
            try:
                self._matchers[rid] = future.result()
                requests.append(request)
            except InvalidParameterError as exc:
                refused.append(Rejected(rid, str(exc)))
            except Exception as exc:  # a grammar library failure is this request's alone
                log.exception("grammar compile failed")
                refused.append(Rejected(rid, f"structured output failed: {exc!r}"))
        return requests, refused

    # -- tokens -------------------------------------------------------------------------
    def observe(self, events: Sequence[TokenEvent]) -> None:
        """Advance matchers by the tokens emitted."""
        matchers = self._matchers
        if not matchers:
            return
        for event in events:
            if type(event) is Token and (m := matchers.get(event.request_id)) is not None \
                    and not m.consume_token(event.token_id):
                log.warning("request %s: token %d breaks its grammar (%s)",
                                event.request_id, event.token_id, m.get_error())

    def forget(self, request_ids: Iterable[str]) -> None:
        if self._matchers:
            for rid in request_ids:
                self._matchers.pop(rid, None)

    def constrains(self, sampling_rows: Sequence[ScheduledRow]) -> bool:
        matchers = self._matchers
        return bool(matchers) and any(r.seq.request_id in matchers for r in sampling_rows)

    def token_mask(self, sampling_rows: Sequence[ScheduledRow],
                   device: torch.device) -> TokenMask | None:
        """The bitmask of every sampling row with a grammar (row order), or None."""
        matchers = self._matchers
        if not matchers:
            return None
        picked = [(i, m) for i, row in enumerate(sampling_rows)
                  if (m := matchers.get(row.seq.request_id)) is not None]
        if not picked:
            return None
        words = -(-self._vocab_size // 32)
        host = torch.empty((len(picked), words), dtype=torch.int32,
                           pin_memory=device.type == "cuda")
        # llguidance's raw-pointer calls (its llguidance.torch helpers do the same, but that
        # module applies torch.compile at import, which pulls in torch._dynamo, sympy and
        # networkx: twice the objects every full garbage collection of the engine walks).
        row_bytes = words * 4
        if len(picked) >= PARALLEL_FILL_ROWS:
            if self._executor is None:
                self._executor = llguidance.LLExecutor()
            self._executor.unsafe_compute_mask_ptr(
                [(m, j) for j, (_, m) in enumerate(picked)], host.data_ptr(), row_bytes,
                len(picked))
        else:
            for j, (_, m) in enumerate(picked):
                m.unsafe_compute_mask_ptr(host[j].data_ptr(), row_bytes)
        rows = torch.tensor([i for i, _ in picked], dtype=torch.int64)
        if device.type == "cuda":
            rows = rows.pin_memory()
        return TokenMask(rows.to(device, non_blocking=True), host.to(device, non_blocking=True))
