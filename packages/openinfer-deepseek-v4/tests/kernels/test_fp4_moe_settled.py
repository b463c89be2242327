"""The FP4 experts' decode path with settled inputs (`decode.py`; `OPENINFER_PDL_PRELOAD=
experts`): the first launch reads and computes before its PDL wait and stores after it. Under
the interpreter the wait is stood in for by a function that records whether the launch had
stored anything yet (h is filled with NaN first, through a wrapped `torch.empty`), and the
result must have the bits of the unsettled launch; compiled for sm90 down to PTX
(`moe_settled_ptx_unit.py`), every global load comes before `griddepcontrol.wait` and every
store after it. On a GPU the same-bits test runs compiled with PDL as it launches."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fp4_moe import DEVICE, LIMIT, make

import openinfer_deepseek_v4.kernels.moe.decode as decode_module
import openinfer_kernels.pdl as pdl_module
from openinfer_deepseek_v4.kernels.moe.decode import DecodeTile
from openinfer_deepseek_v4.kernels.moe.triton import fp4_moe_experts_triton
from openinfer_kernels.testing.compiled_session import run_compiled_session

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
HIDDEN, INTER = 96, 160


class Wait:
    """Stands in for `griddepcontrol.wait`: at each call, whether `h` (the first launch's
    output, NaN until stored) is still all NaN."""

    def __init__(self) -> None:
        self.h: torch.Tensor | None = None
        self.untouched: list[bool] = []

    def __call__(self) -> None:
        if self.h is not None:
            self.untouched.append(bool(torch.isnan(self.h).all()))


@pytest.fixture
def wait(monkeypatch: pytest.MonkeyPatch) -> Iterator[Wait]:
    stand_in = Wait()
    if INTERPRETED:
        monkeypatch.setattr(pdl_module, "gdc_wait", stand_in)
        monkeypatch.setattr(pdl_module, "gdc_launch_dependents", lambda: None)
    if DEVICE == "cpu":
        monkeypatch.setattr(decode_module, "pdl_launch", lambda _t: {"PDL": True})
    monkeypatch.setattr(decode_module, "PRELOAD", True)
    yield stand_in


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "k"), [(1, 1), (1, 6), (3, 2)])
def test_settled_experts_have_the_unsettled_bits(wait, dtype, t, k):
    case = make(t, HIDDEN, INTER, experts=7, k=k, dtype=dtype, seed=t * 10 + k)
    case["weights"][0, 0] = 0.0  # a pair that reads nothing, stores nothing, never waits
    tile = DecodeTile(block_n=64, block_k=32, down_block_n=64, down_block_k=32)
    run: dict[str, Any] = dict(**case, limit=LIMIT, path="decode", tile=tile)
    want = fp4_moe_experts_triton(**run)
    got = fp4_moe_experts_triton(**run, settled=True)
    assert torch.equal(got, want)


@pytest.mark.skipif(not INTERPRETED, reason="stands in for the PDL wait under the interpreter")
def test_one_settled_program_stores_only_after_its_wait(wait, monkeypatch):
    # One token, one expert, one block of rows: the first launch is one program.
    case = make(1, HIDDEN, INTER, experts=3, k=1, dtype=torch.float32, seed=3)
    tile = DecodeTile(block_n=256, block_k=32, down_block_n=128, down_block_k=32)
    real_empty = torch.empty

    def nan_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = real_empty(*args, **kwargs)
        if out.is_floating_point():
            out.fill_(float("nan"))
        if wait.h is None:  # the first: h
            wait.h = out
        return out

    monkeypatch.setattr(decode_module.torch, "empty", nan_empty)
    out = fp4_moe_experts_triton(**case, limit=LIMIT, path="decode", tile=tile, settled=True)
    assert wait.untouched[0], "the settled launch stored before its wait"
    assert torch.isfinite(out).all()


def test_the_settled_launch_compiles_with_its_loads_before_the_wait() -> None:
    run_compiled_session(Path(__file__).with_name("moe_settled_ptx_unit.py"), min_passed=2)
