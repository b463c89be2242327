"""The engine on the `triton` attention backend (its kernels under the Triton interpreter here)
against the `torch` backend's reference ops: the same greedy tokens and near-equal logprobs.
Decode steps on `triton` norm, rotate and append inside the decode attention kernel
(`attend_normed`); prompt steps run the q/k norm + rotary + append kernel, then attention."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from openinfer_core import LLM, SamplingParams


def test_triton_backend_decodes_as_the_reference_does(qwen3_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from openinfer_kernels.attention import triton_backend

    fused = triton_backend.paged_decode_norm_rope
    calls = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0].shape[0])
        return fused(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "paged_decode_norm_rope", counted)
    prompts = ["hello there, a prompt long enough to fill more than one page", "hi", "abc d"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    runs = {}
    for backend in ("torch", "triton"):
        llm = LLM(qwen3_dir, device="cpu", attention_backend=backend, num_kv_blocks=64,
                  block_size=4)
        runs[backend] = [o.outputs[0] for o in llm.generate(prompts, params)]
    for ref, got in zip(runs["torch"], runs["triton"], strict=True):
        assert got.token_ids == ref.token_ids and len(got.token_ids) == 12
        for token, a, b in zip(ref.token_ids, ref.logprobs, got.logprobs, strict=True):
            assert math.isclose(a[token], b[token], abs_tol=1e-4)
    assert calls, "no decode step went through the fused kernel"
