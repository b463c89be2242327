"""Which all-reduce path a message takes (`distributed/all_reduce.py`): the rule is pure, so
it is checked here without GPUs; the paths themselves run in `benchmarks/device/all_reduce.py`
and the GPU tensor-parallel gate."""

from __future__ import annotations

import datetime
import multiprocessing
from pathlib import Path
from typing import Any

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


def _open_rank(rank: int, store: str, opened_before: bool, results: Any) -> None:
    """One gloo rank of `SymmetricAllReduce._open_on`, torch's symmetric memory stood in for by
    a rendezvous that is a collective (a barrier), as the real one is; this rank's process set
    it up for an earlier group where `opened_before` says so (rank 0 only)."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    calls: list[str] = []

    def rendezvous(buffer: torch.Tensor, group_name: str) -> object:
        calls.append(group_name)
        dist.barrier()
        return object()

    symm_mem.empty = lambda n, dtype, device: torch.empty(n, dtype=dtype)  # type: ignore[assignment]
    symm_mem.rendezvous = rendezvous  # type: ignore[assignment]
    ar._opened_in_process = opened_before and rank == 0
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=20))
    try:
        made = SymmetricAllReduce._open_on(2, torch.device("cpu"), "auto")
        results.put((rank, len(calls), made is not None))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("opened_before", [True, False], ids=["rank0-opened-before", "fresh"])
def test_the_ranks_agree_before_any_starts_a_rendezvous(tmp_path: Path,
                                                         opened_before: bool) -> None:
    """A process that builds a second tensor-parallel group (a test comparing layouts) has set
    symmetric memory up once already and will not again, while its new workers are fresh:
    every rank then skips the rendezvous (one that started it would wait for rank 0 forever,
    as the DeepSeek-V4 TP2-then-EP gate did on 2 H200s) and all take NCCL alike."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    ranks = [context.Process(target=_open_rank, args=(r, str(tmp_path / "store"),
                                                     opened_before, results))
             for r in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(60)
        if process.is_alive():
            process.kill()
    assert [p.exitcode for p in ranks] == [0, 0]
    got = sorted(results.get(timeout=5) for _ in ranks)
    if opened_before:
        assert got == [(0, 0, False), (1, 0, False)]  # nobody waits in a rendezvous
    else:
        # Both ranks meet in the rendezvous; whether they keep the buffer then depends on
        # the build's symm_mem ops, but they agree.
        assert [g[1] for g in got] == [1, 1] and got[0][2] == got[1][2]
