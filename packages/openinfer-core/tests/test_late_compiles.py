"""A kernel compiled after start-up is named in the log (`late_compiles.py`)."""

from __future__ import annotations

import logging

import pytest

from openinfer_core.late_compiles import log_late_compiles


def test_a_late_compile_is_logged_with_its_specialization(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    knobs = pytest.importorskip("triton").knobs
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    assert log_late_compiles()
    hook = knobs.runtime.jit_post_compile_hook
    assert hook is not None
    with caplog.at_level(logging.INFO, logger="openinfer"):
        compile = {"signature": {"x_ptr": "*bf16", "T": "i32", "K": "i32", "one": "constexpr",
                                 "eps": "fp32", "BLOCK": "constexpr"},
                   "constants": {(3,): 1, (5,): 64},
                   "configs": [{(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}]}
        assert hook(key="k", repr="_mix_kernel[num_warps=4](x_ptr: (", fn=None, compile=compile,
                    is_manual_warmup=False, already_compiled=False) is False
        hook(key="k", repr="_other_kernel", fn=None, compile={"signature": 3},
             is_manual_warmup=False, already_compiled=False)
    assert ("kernel compiled after start-up: _mix_kernel(T:n, K:16n, one=1, BLOCK=64) ("
            in caplog.text)
    assert "kernel compiled after start-up: _other_kernel() (" in caplog.text
