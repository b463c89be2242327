"""Which all-reduce path a message takes (`distributed/all_reduce.py`): the rule is pure, so
it is checked here without GPUs; the paths themselves run in `benchmarks/device/all_reduce.py`
and the GPU tensor-parallel gate."""

from __future__ import annotations

import pytest
import torch

from openinfer_core.distributed import all_reduce as ar
from openinfer_core.distributed.all_reduce import SymmetricAllReduce


def _symmetric(forced: str = "auto", size: int = 2) -> SymmetricAllReduce:
    buffer = torch.empty(max(ar.TWO_SHOT_MAX[size], ar.ONE_SHOT_MAX[size]), dtype=torch.uint8)
    return SymmetricAllReduce(buffer, "group", size, forced)


def _bf16(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes // 2, dtype=torch.bfloat16)


def test_each_size_takes_the_measured_path() -> None:
    s = _symmetric()
    one, two = ar.ONE_SHOT_MAX[2], ar.TWO_SHOT_MAX[2]
    assert s.path(_bf16(8 << 10)) == "one_shot"
    assert s.path(_bf16(one)) == "one_shot"
    assert s.path(_bf16(one + 32)) == "two_shot"
    assert s.path(_bf16(two)) == "two_shot"
    assert s.path(_bf16(two + 32)) == "nccl"  # past the buffer


def test_two_shot_needs_whole_16_byte_parts_per_rank() -> None:
    s = _symmetric()
    odd = _bf16(ar.ONE_SHOT_MAX[2] + 34)  # 34 bytes past a 32-byte multiple: no whole 16-byte parts
    assert s.path(odd) == "nccl"
    assert _symmetric("two_shot").path(odd) == "nccl"
    assert _symmetric("one_shot").path(odd) == "one_shot"


def test_only_float_dtypes_go_through_symmetric_memory() -> None:
    s = _symmetric()
    assert s.path(torch.empty(64, dtype=torch.int64)) == "nccl"
    assert s.path(torch.empty(64, dtype=torch.float32)) == "one_shot"


def test_a_forced_path_is_taken_at_every_size_it_can_carry() -> None:
    assert _symmetric("one_shot").path(_bf16(ar.TWO_SHOT_MAX[2])) == "one_shot"
    assert _symmetric("two_shot").path(_bf16(8 << 10)) == "two_shot"


def test_open_refuses_an_unknown_path_and_keeps_nccl_off_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ar.ALL_REDUCE_ENV, "ring")
    with pytest.raises(ValueError, match="auto, nccl, one_shot or two_shot"):
        SymmetricAllReduce.open(2, torch.device("cpu"))
    monkeypatch.setenv(ar.ALL_REDUCE_ENV, "auto")
    assert SymmetricAllReduce.open(2, torch.device("cpu")) is None
