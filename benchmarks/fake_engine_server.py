"""The real HTTP app over a fake engine that emits one token per running request every
`--step-ms`: what one frontend process costs per streamed token, with no GPU and no model.
It served the profile of the frontend (py-spy against it) and the CPU-per-token figures in
BENCHMARKS.md ("Serving at engine speed").

Usage: python benchmarks/fake_engine_server.py TOKENIZER_DIR [--port 8077] [--step-ms 10],
then `openinfer bench serve --base-url http://127.0.0.1:8077 --model fake --tokenizer
TOKENIZER_DIR --random-input-len 128 --random-output-len 128 --num-prompts 1024
--max-concurrency 512 --ignore-eos`; the server's CPU seconds (/proc/PID/stat, utime + stime)
over the run, divided by the tokens streamed, is its cost per token."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import AsyncIterator

import uvicorn

from openinfer_core.engine.streams import EventStreams
from openinfer_core.events import Finished, FinishReason, Scheduled, Token, TokenEvent
from openinfer_core.handle import LoadSnapshot, ModelInfo
from openinfer_core.request import GenerateRequest
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_server.app import build_app


class FakeEngine:
    """An `EngineHandle`: every step, one token (ids cycling over 5,000) for every request."""

    def __init__(self, step_s: float) -> None:
        self._streams = EventStreams()
        self._live: dict[str, tuple[GenerateRequest, list[int]]] = {}
        self._lock = threading.Lock()
        self._step_s = step_s
        threading.Thread(target=self._run, daemon=True).start()

    @property
    def model_info(self) -> ModelInfo:
        return ModelInfo("fake", 4096, 10_000, 16, (151645,))

    @property
    def dead(self) -> str | None:
        return None

    def load(self) -> LoadSnapshot:
        return LoadSnapshot(len(self._live), 0, 0, 10_000)

    def generate(self, request: GenerateRequest) -> AsyncIterator[TokenEvent]:
        return self._streams.run(request, self._submit, self.abort)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._live.pop(request_id, None)

    def _submit(self, request: GenerateRequest) -> None:
        with self._lock:
            self._live[request.request_id] = (request, [0])

    def _run(self) -> None:
        while True:
            time.sleep(self._step_s)
            events: list[TokenEvent] = []
            with self._lock:
                for rid, (request, made) in list(self._live.items()):
                    prompt = len(request.prompt_token_ids)
                    if made[0] == 0:
                        events.append(Scheduled(rid, prompt, 0))
                    events.append(Token(rid, 1000 + made[0] % 5000))
                    made[0] += 1
                    if made[0] >= request.params.max_tokens:
                        events.append(Finished(rid, FinishReason.LENGTH, prompt, made[0]))
                        del self._live[rid]
            if events:
                self._streams.deliver(events)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("--port", type=int, default=8077)
    ap.add_argument("--step-ms", type=float, default=10.0)
    args = ap.parse_args()
    app = build_app(FakeEngine(args.step_ms / 1e3), Tokenizer.from_dir(args.tokenizer),
                    served_model_names=["fake"])
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
