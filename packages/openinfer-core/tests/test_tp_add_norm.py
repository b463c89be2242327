"""When a row-split layer takes the fused all-reduce + add + RMSNorm (`distributed/add_norm.py`,
FlashInfer's; `distributed/symmetric_add_norm.py`, ours): the choice is pure, so it is checked
here without GPUs; the kernels themselves run in `benchmarks/device/add_norm.py`, the GPU
tensor-parallel gate (`gpu_check.sh tpfused`) and tests/gpu/test_tp_add_norm_gpu.py."""

from __future__ import annotations

import pytest
import torch

from openinfer_core.distributed.add_norm import (
    FUSED_NORM_ENV,
    FusedAllReduceAddNorm,
    fused_norm_mode,
)
from openinfer_core.distributed.all_reduce import SymmetricAllReduce, SymmetricPeers
from openinfer_core.distributed.symmetric_add_norm import (
    IDS_ENV,
    PushMemory,
    SymmetricAddNorm,
    ids_mode,
)


def test_flashinfer_off_by_default_and_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither needs a process group: nothing is set up, on any rank.
    monkeypatch.delenv(FUSED_NORM_ENV, raising=False)
    assert FusedAllReduceAddNorm.open(0, 2, torch.device("cuda", 0), 4096, torch.bfloat16) is None
    monkeypatch.setenv(FUSED_NORM_ENV, "flashinfer")
    assert FusedAllReduceAddNorm.open(0, 2, torch.device("cpu"), 4096, torch.bfloat16) is None


def test_auto_takes_ours_where_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    # The default: our push kernel on 2 and 4 ranks (measured faster there), nothing on 8
    # until measured; an explicit mode holds at every size.
    monkeypatch.delenv(FUSED_NORM_ENV, raising=False)
    assert [fused_norm_mode(n) for n in (2, 3, 4, 8)] == ["push", "off", "push", "off"]
    monkeypatch.setenv(FUSED_NORM_ENV, "triton")
    assert [fused_norm_mode(n) for n in (2, 4)] == ["triton", "triton"]
    monkeypatch.setenv(FUSED_NORM_ENV, "off")
    assert fused_norm_mode(2) == "off"


def test_an_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSED_NORM_ENV, "on")
    with pytest.raises(ValueError, match="auto, off, flashinfer, triton, push or linear"):
        FusedAllReduceAddNorm.open(0, 2, torch.device("cpu"), 4096, torch.bfloat16)


def test_only_rows_the_workspace_holds_take_it() -> None:
    fused = FusedAllReduceAddNorm(workspace=None, hidden=64, dtype=torch.bfloat16, max_tokens=8)
    assert fused.fits(torch.empty(1, 64, dtype=torch.bfloat16))
    assert fused.fits(torch.empty(8, 64, dtype=torch.bfloat16))
    assert not fused.fits(torch.empty(9, 64, dtype=torch.bfloat16))  # past the workspace
    assert not fused.fits(torch.empty(0, 64, dtype=torch.bfloat16))
    assert not fused.fits(torch.empty(4, 32, dtype=torch.bfloat16))  # another width
    assert not fused.fits(torch.empty(4, 64, dtype=torch.float32))  # another dtype


def _kernel(x, residual, weight, eps, buffers, pads, rank):  # type: ignore[no-untyped-def]
    raise AssertionError("not called here")


def test_ours_needs_symmetric_memory_and_a_kernel() -> None:
    # Neither answer needs a process group: each is the same on every rank.
    symmetric = SymmetricAllReduce(torch.empty(1 << 20, dtype=torch.uint8), "0", 2, "auto")
    cpu = torch.device("cpu")
    assert SymmetricAddNorm.open(None, _kernel, 4096, torch.bfloat16, cpu) is None
    assert SymmetricAddNorm.open(symmetric, None, 4096, torch.bfloat16, cpu) is None
    assert SymmetricAddNorm.open(symmetric, _kernel, 4096, torch.int64, cpu) is None
    assert SymmetricAddNorm.open(symmetric, _kernel, 1 << 20, torch.bfloat16, cpu) is None


def test_ours_takes_the_rows_its_buffer_holds() -> None:
    peers = SymmetricPeers(buffers=(), pads=(), rank=0)
    ours = SymmetricAddNorm(_kernel, peers, hidden=64, dtype=torch.bfloat16, max_rows=8)
    assert ours.fits(torch.empty(8, 64, dtype=torch.bfloat16))
    assert not ours.fits(torch.empty(9, 64, dtype=torch.bfloat16))  # past the buffer
    assert not ours.fits(torch.empty(0, 64, dtype=torch.bfloat16))
    assert not ours.fits(torch.empty(4, 32, dtype=torch.bfloat16))
    assert not ours.fits(torch.empty(4, 64, dtype=torch.float32))


class _Push:
    """A stand-in push kernel that records the rows it was called with."""

    max_rows = 4
    area_fill = 0
    takes_shares = True

    def __init__(self) -> None:
        self.rows: list[int] = []

    def area_elements(self, world: int, hidden: int) -> int:
        return 2 * world * self.max_rows * hidden

    def flag_slots(self, world: int) -> int:
        return self.max_rows * world

    def __call__(self, x, residual, weight, eps, areas, flags, seqs, rank):  # type: ignore[no-untyped-def]
        self.rows.append(x.shape[0])
        return x, residual

    def all_reduce(self, x, areas, seqs, rank):  # type: ignore[no-untyped-def]
        self.rows.append(-x.shape[0])  # negative: the sum-only form
        return x + 1

    def reduce_shares(self, shares, residual, weight, eps, areas, flags, seqs, rank):  # type: ignore[no-untyped-def]
        self.rows.append(100 * shares.shape[0] + shares.shape[1])  # shares x 100 + rows
        return shares.sum(0), residual


def test_the_plain_all_reduce_takes_the_push_rows_of_its_width_and_dtype() -> None:
    push = _Push()
    memory = PushMemory(push, (), (), torch.zeros(4, dtype=torch.int32), None)
    peers = SymmetricPeers(buffers=(), pads=(), rank=0)
    ours = SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.float32, max_rows=16,
                            push=memory)
    assert torch.equal(ours.reduce(torch.zeros(3, 8)), torch.ones(3, 8))
    assert ours.reduce(torch.zeros(5, 8)) is None  # past the push kernel's rows
    assert ours.reduce(torch.zeros(0, 8)) is None
    assert ours.reduce(torch.zeros(2, 16)) is None  # another width
    assert ours.reduce(torch.zeros(2, 8, dtype=torch.bfloat16)) is None  # another dtype
    assert ours.reduce(torch.zeros(2, 2, 8)) is None  # not rows
    assert push.rows == [-3]
    no_push = SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.float32, max_rows=16)
    assert no_push.reduce(torch.zeros(1, 8)) is None


def test_push_takes_its_rows_and_the_pull_kernel_the_rest() -> None:
    pulled: list[int] = []

    def pull(x, residual, weight, eps, buffers, pads, rank):  # type: ignore[no-untyped-def]
        pulled.append(x.shape[0])
        return x, residual

    push = _Push()
    memory = PushMemory(push, (), (), torch.zeros(4, dtype=torch.int32), None)
    peers = SymmetricPeers(buffers=(), pads=(), rank=0)
    ours = SymmetricAddNorm(pull, peers, hidden=8, dtype=torch.float32, max_rows=16, push=memory)
    w = torch.ones(8)
    for t in (1, 4, 5, 16):
        ours(torch.zeros(t, 8), torch.zeros(t, 8), w, 1e-6)
    assert push.rows == [1, 4] and pulled == [5, 16]


def test_without_the_pull_kernel_steps_past_the_push_rows_run_unfused() -> None:
    # Past 2 ranks `open` gives the one-shot kernel no rows (`PULL_RANKS`): a step the push
    # kernel cannot take is not the fused kernel's at all, and the group runs it unfused.
    memory = PushMemory(_Push(), (), (), torch.zeros(4, dtype=torch.int32), None)
    peers = SymmetricPeers(buffers=(), pads=(), rank=0)
    ours = SymmetricAddNorm(lambda *a: a[:2], peers, hidden=8, dtype=torch.float32, max_rows=0,
                            push=memory)
    assert [ours.fits(torch.zeros(t, 8)) for t in (1, 4, 5, 16)] == [True, True, False, False]
    alone = SymmetricAddNorm(lambda *a: a[:2], peers, hidden=8, dtype=torch.float32,
                             max_rows=16, push=None)
    assert [alone.fits(torch.zeros(t, 8)) for t in (1, 16, 17)] == [True, True, False]


def test_push_is_a_mode_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSED_NORM_ENV, "push")
    assert [fused_norm_mode(n) for n in (2, 4)] == ["push", "push"]


def test_push_areas_are_handed_out_for_their_width_and_dtype_only() -> None:
    seqs = torch.zeros(4, dtype=torch.int32)
    areas = (torch.zeros(64), torch.zeros(64))
    memory = PushMemory(_Push(), areas, (), seqs, None)
    peers = SymmetricPeers(buffers=(), pads=(), rank=1)
    ours = SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.float32, max_rows=16,
                            push=memory)
    got = ours.push_areas(8, torch.float32)
    assert got is not None
    assert got.areas is areas and got.seqs is seqs
    assert (got.rank, got.max_rows, got.area_fill) == (1, 4, 0)
    assert ours.push_areas(16, torch.float32) is None
    assert ours.push_areas(8, torch.bfloat16) is None
    no_push = SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.float32, max_rows=16)
    assert no_push.push_areas(8, torch.float32) is None


class _Ids:
    """A stand-in ids kernel: records each call; takes up to 4 ids."""

    slots, programs, fill = 8, 2, 0xFF

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, ids, areas, seqs, rank):  # type: ignore[no-untyped-def]
        if ids.numel() > 4:
            return False
        self.calls.append((ids.numel(), rank))
        return True


def test_token_ids_go_to_the_ids_kernel_where_it_is_open() -> None:
    ids = _Ids()
    slots = (torch.full((8,), -1, dtype=torch.int32),) * 2
    memory = PushMemory(_Push(), (), (), torch.zeros(4, dtype=torch.int32), None, ids=ids,
                        id_slots=slots, id_seqs=torch.zeros(2, dtype=torch.int32))
    peers = SymmetricPeers(buffers=(), pads=(), rank=1)
    ours = SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.float32, max_rows=16,
                            push=memory)
    assert ours.broadcast_ids(torch.zeros(3, dtype=torch.int64))
    assert not ours.broadcast_ids(torch.zeros(5, dtype=torch.int64))  # the kernel refuses
    assert ids.calls == [(3, 1)]
    without = SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.float32, max_rows=16,
                               push=PushMemory(_Push(), (), (), torch.zeros(4), None))
    assert not without.broadcast_ids(torch.zeros(3, dtype=torch.int64))
    assert not SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.float32,
                                max_rows=16).broadcast_ids(torch.zeros(3, dtype=torch.int64))


def test_the_ids_mode_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(IDS_ENV, raising=False)
    assert ids_mode() == "push"
    monkeypatch.setenv(IDS_ENV, "nccl")
    assert ids_mode() == "nccl"
    monkeypatch.setenv(IDS_ENV, "shm")
    with pytest.raises(ValueError, match="push or nccl"):
        ids_mode()


def test_split_k_shares_go_to_the_push_kernel_alone() -> None:
    """fp32 shares [S, T, hidden] fit only where the push kernel takes them and their rows
    are within its rows; the call hands them over as they are."""
    push = _Push()
    memory = PushMemory(push, (), (), torch.zeros(4, dtype=torch.int32), None)
    peers = SymmetricPeers(buffers=(), pads=(), rank=0)
    ours = SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.bfloat16, max_rows=16,
                            push=memory)
    assert ours.fits(torch.zeros(3, 2, 8))
    assert not ours.fits(torch.zeros(3, 5, 8))  # past the push kernel's rows
    assert not ours.fits(torch.zeros(3, 2, 8, dtype=torch.bfloat16))  # shares are fp32
    assert not ours.fits(torch.zeros(3, 2, 16))  # another width
    w = torch.ones(8, dtype=torch.bfloat16)
    normed, _ = ours(torch.ones(3, 2, 8), torch.zeros(2, 8, dtype=torch.bfloat16), w, 1e-6)
    assert push.rows == [302] and torch.equal(normed, torch.full((2, 8), 3.0))
    push.takes_shares = False  # the rows signalled by flags
    assert not ours.fits(torch.zeros(3, 2, 8))
    without = SymmetricAddNorm(_kernel, peers, hidden=8, dtype=torch.bfloat16, max_rows=16)
    assert not without.fits(torch.zeros(3, 2, 8))
