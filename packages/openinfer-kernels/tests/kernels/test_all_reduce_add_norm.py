"""The all-reduce + add + RMSNorm over symmetric memory (`collective/`): the reference against
`fused_add_rms_norm_ref` of the summed partials, and the kernel against the reference: alone
(one rank: no peer, no barrier) and as 2 and 3 ranks in as many processes, whose "symmetric
memory" is CPU shared memory mapped at the same address in each (fork). Under the interpreter
the ranks' programs really meet through the signal pads' atomics, so the barrier's pairing and
the pads' return to 0 are checked here; on a GPU the 2-GPU test is
tests/gpu/test_tp_add_norm_gpu.py. The TTIR sweep compiles what this file launches in its own
process (one rank alone, rank 0 of 2 and 3)."""

from __future__ import annotations

import functools
import operator

import pytest
import torch

from openinfer_kernels.collective import all_reduce_add_rms_norm_ref
from openinfer_kernels.collective.triton import MAX_PROGRAMS, all_reduce_add_rms_norm_triton
from openinfer_kernels.norm import fused_add_rms_norm_ref, rms_norm_ref
from openinfer_kernels.testing.ranks import run_ranks_forked

# The kernel runs compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
PAD_SLOTS = 512  # torch's signal pad: 2 KB of int32


def inputs(world: int, t: int, h: int, dtype: torch.dtype, seed: int = 0,
           device: str = "cpu"):
    """(every rank's partial [T, H], the residual, the weight): the residual and the weight are
    the same on every rank, as in the model."""
    g = torch.Generator().manual_seed(seed)
    partials = [torch.randn(t, h, generator=g).to(device, dtype) for _ in range(world)]
    residual = torch.randn(t, h, generator=g).to(device, dtype)
    weight = (1 + 0.5 * torch.randn(h, generator=g)).to(device, dtype)
    return partials, residual, weight


def in_rank_order(parts: list[torch.Tensor]) -> torch.Tensor:
    """((p0 + p1) + p2) + ...: the kernel's order (an fp32 sum depends on it)."""
    return functools.reduce(operator.add, parts)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reference_is_the_rounded_sum_then_fused_add_norm(world, dtype):
    partials, residual, weight = inputs(world, 7, 60, dtype)
    normed, summed = all_reduce_add_rms_norm_ref(partials, residual, weight, EPS)
    total = in_rank_order([p.float() for p in partials]).to(dtype)
    want_normed, want_summed = fused_add_rms_norm_ref(total, residual, weight, EPS)
    assert torch.equal(summed, want_summed) and torch.equal(normed, want_normed)
    assert summed.dtype == dtype and normed.dtype == dtype


def stream_as_the_kernel_rounds(partials: list[torch.Tensor],
                                residual: torch.Tensor) -> torch.Tensor:
    """The reference's new residual stream, but rounded as the kernel rounds it where it runs:
    compiled, to nearest as torch does (the reference itself); under the interpreter, which
    casts fp32 -> bf16 by truncation, truncated at both of its roundings (the sum, then the
    add), so that the kernel's stream is checked bit for bit either way."""
    if partials[0].is_cuda or partials[0].dtype != torch.bfloat16:
        return all_reduce_add_rms_norm_ref(partials, residual, residual[0], EPS)[1]

    def truncated(x: torch.Tensor) -> torch.Tensor:
        return (x.view(torch.int32) & -(1 << 16)).view(torch.float32)

    total = in_rank_order([p.float() for p in partials])
    return truncated(truncated(total) + residual.float()).to(torch.bfloat16)


def assert_kernel_alike(got: tuple[torch.Tensor, torch.Tensor],
                        partials: list[torch.Tensor], residual: torch.Tensor,
                        weight: torch.Tensor) -> None:
    """(normed, summed): the stream bit for bit, and the norm as the norm of that stream (as
    test_rms_norm checks it): the row's sum of squares in another order (a few fp32 ulp); in
    bf16 each of its two roundings one ulp (2^-7 relative) apart at most."""
    normed, summed = got
    assert torch.equal(summed, stream_as_the_kernel_rounds(partials, residual))
    tol = dict(rtol=2**-6, atol=1e-5) if normed.dtype == torch.bfloat16 else dict(rtol=1e-5,
                                                                                 atol=1e-5)
    torch.testing.assert_close(normed, rms_norm_ref(summed, weight, EPS), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("t", "h"), [(1, 60), (MAX_PROGRAMS + 6, 24)], ids=str)
def test_one_rank_is_the_reference(t, h, dtype):
    # More rows than programs: a program takes rows pid, pid + programs, ...
    [x], residual, weight = inputs(1, t, h, dtype, seed=1, device=DEVICE)
    buffer = torch.zeros(t * h + 5, dtype=dtype, device=DEVICE)
    pad = torch.zeros(PAD_SLOTS, dtype=torch.int32, device=DEVICE)
    x_before, residual_before = x.clone(), residual.clone()
    got = all_reduce_add_rms_norm_triton(x, residual, weight, EPS, [buffer], [pad], 0)
    assert_kernel_alike(got, [x], residual, weight)
    assert torch.equal(buffer[:t * h].view(t, h), x)  # staged in this rank's buffer
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)
    assert not pad.any()


def test_rows_past_the_buffer_are_refused():
    [x], residual, weight = inputs(1, 3, 8, torch.float32)
    with pytest.raises(ValueError, match="do not fit the symmetric buffer"):
        all_reduce_add_rms_norm_triton(x, residual, weight, EPS, [torch.zeros(23)],
                                       [torch.zeros(PAD_SLOTS, dtype=torch.int32)], 0)


def _run_rank(rank, calls, buffers, pads, outs):
    """Every call of `calls` as rank `rank`, its outputs into outs[rank][call]."""
    for n, (partials, residual, weight) in enumerate(calls):
        normed, summed = all_reduce_add_rms_norm_triton(partials[rank], residual, weight, EPS,
                                                        buffers, pads, rank)
        outs[rank][n, 0].copy_(normed)
        outs[rank][n, 1].copy_(summed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks of CPU shared memory under the "
                    "interpreter; on GPUs: tests/gpu/test_tp_add_norm_gpu.py")
@pytest.mark.parametrize(("world", "t", "h"), [(2, MAX_PROGRAMS + 6, 24), (3, 3, 60)],
                         ids=["2-ranks-rows-past-the-programs", "3-ranks"])
def test_ranks_in_processes_meet_through_the_pads(world, t, h):
    dtype = torch.bfloat16
    # Two calls in a row on the same buffers and pads: the second meets the peers only if the
    # first left every slot at 0, and reads the second call's rows.
    calls = [inputs(world, t, h, dtype, seed=s) for s in (2, 3)]
    buffers = [torch.zeros(t * h, dtype=dtype).share_memory_() for _ in range(world)]
    pads = [torch.zeros(PAD_SLOTS, dtype=torch.int32).share_memory_() for _ in range(world)]
    outs = [torch.zeros(len(calls), 2, t, h, dtype=dtype).share_memory_() for _ in range(world)]
    assert run_ranks_forked(world, _run_rank, calls, buffers, pads, outs) == [0] * (world - 1)
    for n, (partials, residual, weight) in enumerate(calls):
        for rank in range(world):
            assert torch.equal(outs[rank][n], outs[0][n]), "the ranks disagree"
        assert_kernel_alike((outs[0][n, 0], outs[0][n, 1]), partials, residual, weight)
    for rank in range(world):
        assert not pads[rank].any(), f"rank {rank}'s signal pad is left with flags"
        assert torch.equal(buffers[rank].view(t, h), calls[-1][0][rank])
