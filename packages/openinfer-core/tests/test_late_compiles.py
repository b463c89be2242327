"""A kernel compiled after start-up is named in the log (`startup/late_compiles.py`)."""

from __future__ import annotations

import logging

import pytest

from openinfer_core.startup.late_compiles import log_late_compiles


def test_a_late_compile_is_logged_with_its_specialization(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    knobs = pytest.importorskip("triton").knobs
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    assert log_late_compiles()
    hook = knobs.runtime.jit_post_compile_hook
    assert hook is not None
    with caplog.at_level(logging.INFO, logger="openinfer"):
        assert hook(key="k", repr="_mix_kernel(x_ptr, fn_ptr)", fn=None, compile={},
                    is_manual_warmup=False, already_compiled=False) is False
    assert "kernel compiled after start-up: _mix_kernel(x_ptr, fn_ptr) (" in caplog.text
