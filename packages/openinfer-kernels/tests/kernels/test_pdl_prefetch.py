"""The L2 prefetch of weights before `pdl_enter` (`OPENINFER_PDL_PREFETCH_MB`): how many lines
a program asks for here, and (`prefetch_ptx_unit.py`, in a process with the interpreter off)
that the small-batch linear kernels compile for sm90 through ptxas with the prefetches ahead of
`griddepcontrol.wait`. The interpreter has no inline PTX, so the CPU never runs it; the timing
is the device's (`prefetch` stage)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer_kernels.pdl import MAX_PREFETCHES, PREFETCH_ENV, prefetch_lines
from openinfer_kernels.testing.compiled_session import run_compiled_session


def test_no_budget_no_prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PREFETCH_ENV, raising=False)
    assert prefetch_lines(4096, 2, 4096, 1, 16) == 0
    monkeypatch.setenv(PREFETCH_ENV, "0")
    assert prefetch_lines(4096, 2, 4096, 1, 16) == 0


def test_lines_fit_the_share_the_budget_and_the_registers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFETCH_ENV, "24")
    # 4096 rows of 2048 bf16 (16 MB) fit 24 MB whole: the share's 32 lines.
    assert prefetch_lines(4096, 2, 2048, 1, 16) == 32
    # A share of 48 lines rounds up to the next power of two (the kernel masks the rest).
    assert prefetch_lines(1024, 2, 3072, 1, 16) == 64
    # 24576 rows of 4096 bf16 (192 MB): 24 MB / 24576 rows / 128 B = 8 lines a row.
    assert prefetch_lines(24576, 2, 4096, 1, 16) == 8
    # Split K: each share's programs prefetch their own part of the budget.
    assert prefetch_lines(24576, 2, 1024, 4, 16) == 2
    # No more than MAX_PREFETCHES addresses a program.
    lines = prefetch_lines(256, 2, 65536, 1, 64)
    assert lines * 64 <= MAX_PREFETCHES and lines & (lines - 1) == 0
    # Less than a line a row in the budget: none.
    monkeypatch.setenv(PREFETCH_ENV, "0.001")
    assert prefetch_lines(24576, 2, 4096, 1, 16) == 0


def test_a_bad_budget_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFETCH_ENV, "lots")
    with pytest.raises(ValueError, match=PREFETCH_ENV):
        prefetch_lines(4096, 2, 4096, 1, 16)


def test_the_kernels_compile_with_the_prefetch_ahead_of_the_wait() -> None:
    run_compiled_session(Path(__file__).with_name("prefetch_ptx_unit.py"), min_passed=7)
