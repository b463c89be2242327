"""When a row-split layer takes the fused all-reduce + add + RMSNorm (`distributed/add_norm.py`):
the choice is pure, so it is checked here without GPUs; the kernel itself runs in
`benchmarks/device/add_norm.py` and the GPU tensor-parallel gate (`gpu_check.sh tpfused`)."""

from __future__ import annotations

import pytest
import torch

from openinfer_core.distributed.add_norm import FUSED_NORM_ENV, FusedAllReduceAddNorm


def test_off_by_default_and_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither needs a process group: nothing is set up, on any rank.
    monkeypatch.delenv(FUSED_NORM_ENV, raising=False)
    assert FusedAllReduceAddNorm.open(0, 2, torch.device("cuda", 0), 4096, torch.bfloat16) is None
    monkeypatch.setenv(FUSED_NORM_ENV, "flashinfer")
    assert FusedAllReduceAddNorm.open(0, 2, torch.device("cpu"), 4096, torch.bfloat16) is None


def test_an_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSED_NORM_ENV, "on")
    with pytest.raises(ValueError, match="off or flashinfer"):
        FusedAllReduceAddNorm.open(0, 2, torch.device("cpu"), 4096, torch.bfloat16)


def test_only_rows_the_workspace_holds_take_it() -> None:
    fused = FusedAllReduceAddNorm(workspace=None, hidden=64, dtype=torch.bfloat16, max_tokens=8)
    assert fused.fits(torch.empty(1, 64, dtype=torch.bfloat16))
    assert fused.fits(torch.empty(8, 64, dtype=torch.bfloat16))
    assert not fused.fits(torch.empty(9, 64, dtype=torch.bfloat16))  # past the workspace
    assert not fused.fits(torch.empty(0, 64, dtype=torch.bfloat16))
    assert not fused.fits(torch.empty(4, 32, dtype=torch.bfloat16))  # another width
    assert not fused.fits(torch.empty(4, 64, dtype=torch.float32))  # another dtype
