"""One rank of test_tp_add_norm_gpu.py: our all-reduce + add + RMSNorm over symmetric memory
(`OPENINFER_TP_FUSED_NORM=triton`, or `push`: the push kernel up to its rows, the one-shot
past them on 2 ranks, its rows signalling by themselves; `push-flags`: the same with flags,
`OPENINFER_TP_PUSH_SIGNAL=flags`; `linear`: push, and a row-split linear pushing its own rows,
checked too) against the reference of every rank's partials and against the unfused path,
eagerly and replayed from a CUDA graph; the group's plain all-reduce (pushed, sum only,
up to the push kernel's rows with the rows as their signal); and, with the push kernel, rank
0's token ids pushed by `broadcast`. Spawned: importable by name."""

from __future__ import annotations

import functools
import json
import os
import traceback
from pathlib import Path

import torch

HIDDEN = 4096
ROWS = [1, 7, 64, 300]  # 300: more rows than programs, each program loops
EPS = 1e-6
REPLAYS = 5


def run_rank(rank: int, size: int, store: str, out: str, mode: str = "triton") -> None:
    """Every check on this rank; writes {"error": traceback or "", **measures} to out.rank."""
    from openinfer_core.distributed.add_norm import FUSED_NORM_ENV
    from openinfer_core.distributed.group import TorchTensorParallelGroup

    fused_mode, _, signal = mode.partition("-")
    os.environ[FUSED_NORM_ENV] = fused_mode
    if signal:  # read when openinfer_kernels.collective loads, in _checks
        os.environ["OPENINFER_TP_PUSH_SIGNAL"] = signal
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    group = TorchTensorParallelGroup(rank, size, device, Path(store), 120.0)
    result: dict[str, object] = {"error": ""}
    try:
        result.update(_checks(group, rank, size, device))
    except Exception:
        result["error"] = traceback.format_exc()
    finally:
        Path(f"{out}.{rank}").write_text(json.dumps(result))
        group.close()


def _checks(group, rank: int, size: int, device: torch.device) -> dict[str, object]:  # type: ignore[no-untyped-def]
    from openinfer_core.distributed.symmetric_add_norm import SymmetricAddNorm
    from openinfer_kernels import fused_add_rms_norm
    from openinfer_kernels.collective import (
        all_reduce_add_rms_norm,
        all_reduce_add_rms_norm_push,
        all_reduce_add_rms_norm_ref,
        linear_push_add_rms_norm,
        push_ids,
    )

    group.enable_add_rms_norm(HIDDEN, torch.bfloat16, kernel=all_reduce_add_rms_norm,
                              push_kernel=all_reduce_add_rms_norm_push,
                              linear_kernel=linear_push_add_rms_norm, ids_kernel=push_ids)
    fused = group._fused
    assert isinstance(fused, SymmetricAddNorm), "the Triton fusion did not open (see the log)"
    linear = os.environ.get("OPENINFER_TP_FUSED_NORM") == "linear"
    assert (fused.linear is not None) == linear, "the pushing linear did not open"
    pushing = os.environ.get("OPENINFER_TP_FUSED_NORM") in ("push", "linear")
    assert (fused.push is not None) == pushing, "the push kernel's memory did not open"
    if pushing:
        assert fused.push is not None and fused.push.ids is not None, "no id slots opened"
        _ids_checks(group, rank, device)
        if fused.push.kernel.takes_shares:
            _shares_checks(group, rank, device)
    g = torch.Generator(device=device).manual_seed(7)  # the same weight on every rank
    weight = (1 + 0.1 * torch.randn(HIDDEN, device=device, generator=g)).to(torch.bfloat16)
    worst_unfused = 0.0
    for t in ROWS:
        mine = torch.Generator(device=device).manual_seed(1000 * rank + t)
        x = torch.randn(t, HIDDEN, device=device, generator=mine).to(torch.bfloat16)
        shared = torch.Generator(device=device).manual_seed(t)  # the residual: every rank's
        residual = torch.randn(t, HIDDEN, device=device, generator=shared).to(torch.bfloat16)
        parts = [torch.empty_like(x) for _ in range(size)]
        torch.distributed.all_gather(parts, x)
        want_normed, want_summed = all_reduce_add_rms_norm_ref(parts, residual, weight, EPS)
        # Past the push kernel's rows on more than 2 ranks, the unfused path (PULL_RANKS).
        pushed = fused.push.kernel.max_rows if fused.push is not None else 0
        taken = t <= max(fused.max_rows, pushed)
        for _ in range(2):  # twice: the second meets the peers only if the first left the pads 0
            got = group.all_reduce_add_rms_norm(x, residual, weight, EPS)
            if not taken:
                assert got is None, f"{t} rows took the fused kernel past its rows"
                continue
            assert got is not None, f"{t} rows did not take the fused kernel"
            normed, summed = got
            # fp32 sums in rank order, rounded as the reference rounds them.
            assert torch.equal(summed, want_summed), f"{t} rows: the stream differs"
            torch.testing.assert_close(normed, want_normed, rtol=2**-6, atol=1e-5)
            _assert_every_rank_alike(normed, summed, size)
        # The plain all-reduce: up to the push kernel's rows with the rows as their signal,
        # its sum-only form (fp32 in rank order, rounded once: the reference's sum, bit for
        # bit); else torch's (bf16 adds: a few ulps apart).
        alone = group.all_reduce(x.clone())
        exact = functools.reduce(torch.add, [p.float() for p in parts]).to(x.dtype)
        if fused.push is not None and fused.push.kernel.area_fill == 0xFF and t <= pushed:
            assert torch.equal(alone, exact), f"{t} rows: the pushed sum differs"
        else:
            torch.testing.assert_close(alone, exact, rtol=2**-6, atol=0.1)
        _assert_every_rank_alike(alone, alone, size)
        if not taken:
            continue
        # The unfused path: the plain all-reduce above, then the add + norm kernel.
        un_normed, un_summed = fused_add_rms_norm(group.all_reduce(x.clone()), residual, weight,
                                                  EPS)
        torch.testing.assert_close(summed, un_summed, rtol=2**-6, atol=0.1)
        torch.testing.assert_close(normed, un_normed, rtol=2**-6, atol=0.1)
        worst_unfused = max(worst_unfused, (summed.float() - un_summed.float()).abs().max().item())
    if linear:
        _linear_checks(group, rank, size, weight, device)
    _graph_replays(group, fused, weight, rank, device)
    torch.cuda.synchronize()
    torch.distributed.barrier()
    assert not fused.peers.pads[rank].any(), "flags left on this rank's signal pad"
    return {"unfused_residual_max_diff": worst_unfused}


def _linear_checks(group, rank: int, size: int, weight: torch.Tensor,  # type: ignore[no-untyped-def]
                   device: torch.device) -> None:
    """The linear pushing its own rows (Qwen3-8B's o_proj shard: [4096, 4096 / size]), 1 to its
    rows, each twice and between push kernel calls on the same memory: the stream bit for bit
    the reference's of every rank's product (`linear`, the same tile and share sums), the norm
    within a bf16 ulp, every rank alike. It takes the rows where the small-batch linear has a
    Triton tile for them (gemm/tiles.py; one row at least: these shards have one at M = 1
    only) and nothing else: past its rows, or on cuBLAS's rows, it does nothing."""
    from openinfer_kernels import linear as small_linear
    from openinfer_kernels.collective import all_reduce_add_rms_norm_ref
    from openinfer_kernels.gemm import small_batch_tile

    k = HIDDEN // size
    g = torch.Generator(device=device).manual_seed(100 + rank)  # this rank's shard
    w = (0.02 * torch.randn(HIDDEN, k, device=device, generator=g)).to(torch.bfloat16)
    most = group._fused.linear.max_rows
    for t in range(1, most + 2):
        x = torch.randn(t, k, device=device, generator=g).to(torch.bfloat16)
        shared = torch.Generator(device=device).manual_seed(t)
        residual = torch.randn(t, HIDDEN, device=device, generator=shared).to(torch.bfloat16)
        got = group.linear_all_reduce_add_rms_norm(x, w, residual, weight, EPS)
        if t > most or small_batch_tile(x, w) is None:
            assert t > 1, "one row did not take the pushing linear"
            assert got is None, f"{t} rows took the pushing linear past its rows or tiles"
            continue
        assert got is not None, f"{t} rows did not take the pushing linear"
        partial = small_linear(x, w)
        parts = [torch.empty_like(partial) for _ in range(size)]
        torch.distributed.all_gather(parts, partial)
        want_normed, want_summed = all_reduce_add_rms_norm_ref(parts, residual, weight, EPS)
        for _ in range(2):
            normed, summed = got
            assert torch.equal(summed, want_summed), f"{t} rows: the stream differs"
            torch.testing.assert_close(normed, want_normed, rtol=2**-6, atol=1e-5)
            _assert_every_rank_alike(normed, summed, size)
            between = group.all_reduce_add_rms_norm(partial, residual, weight, EPS)
            assert between is not None and torch.equal(between[1], want_summed)
            got = group.linear_all_reduce_add_rms_norm(x, w, residual, weight, EPS)
            assert got is not None


def _shares_checks(group, rank: int, device: torch.device) -> None:  # type: ignore[no-untyped-def]
    """A split-K product's fp32 shares handed to the push kernel unsummed: the same outputs,
    bit for bit, as the rows form given their in-order sum rounded to bf16."""
    g = torch.Generator(device=device).manual_seed(3 + rank)
    shared = torch.Generator(device=device).manual_seed(11)
    weight = (1 + 0.1 * torch.randn(HIDDEN, device=device, generator=shared)).to(torch.bfloat16)
    for t, splits in ((1, 2), (4, 4)):
        shares = torch.randn(splits, t, HIDDEN, device=device, generator=g)
        residual = torch.randn(t, HIDDEN, device=device, generator=shared).to(torch.bfloat16)
        got = group.all_reduce_add_rms_norm(shares, residual, weight, EPS)
        assert got is not None, f"{t} rows of {splits} shares did not take the push kernel"
        partial = functools.reduce(torch.add, list(shares)).to(torch.bfloat16)
        want = group.all_reduce_add_rms_norm(partial, residual, weight, EPS)
        assert want is not None
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), \
            f"{t} rows of {splits} shares: not the rows form's bits"


def _ids_checks(group, rank: int, device: torch.device) -> None:  # type: ignore[no-untyped-def]
    """Rank 0's token ids on every rank by `broadcast` (pushed: 1 to 8192 ids, past one
    program's block), each call followed by an all-reduce that meets the ranks, as a model's
    forward does; then the same captured in a CUDA graph and replayed over new ids."""
    def ids_of(n: int, seed: int) -> torch.Tensor:
        g = torch.Generator(device=device).manual_seed(seed)
        return torch.randint(0, 151_936, (n,), device=device, generator=g)

    meet = torch.zeros(1, HIDDEN, device=device, dtype=torch.bfloat16)
    for n, seed in ((1, 1), (1500, 2), (8192, 3), (7, 4), (1, 5)):
        want = ids_of(n, seed)
        ids = want.clone() if rank == 0 else torch.zeros_like(want)
        group.broadcast(ids)
        group.all_reduce(meet.clone())
        torch.cuda.synchronize()
        assert torch.equal(ids, want), f"{n} ids: this rank got others than rank 0's"
    ids = torch.zeros(64, device=device, dtype=torch.int64)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        group.broadcast(ids)  # warm up on the side stream (rank 0's zeros go out)
        group.all_reduce(meet.clone())
        torch.cuda.synchronize()
        torch.distributed.barrier()
        with torch.cuda.graph(graph):
            group.broadcast(ids)
            group.all_reduce(meet.clone())
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    torch.distributed.barrier()
    for n in range(REPLAYS):
        want = ids_of(64, 100 + n)
        ids.copy_(want if rank == 0 else torch.zeros_like(want))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(ids, want), f"replay {n}: this rank got others than rank 0's ids"
    torch.distributed.barrier()


def _assert_every_rank_alike(normed: torch.Tensor, summed: torch.Tensor, size: int) -> None:
    for mine in (normed, summed):
        every = [torch.empty_like(mine) for _ in range(size)]
        torch.distributed.all_gather(every, mine)
        assert all(torch.equal(e, every[0]) for e in every), "the ranks disagree"


def _graph_replays(group, fused, weight: torch.Tensor, rank: int,  # type: ignore[no-untyped-def]
                   device: torch.device) -> None:
    """Ours, torch's one-shot all-reduce (unfused) and ours again captured in one graph, as a
    decode step interleaves them on the same buffer and pads; replayed, each replay's outputs
    equal the eager ones."""
    from openinfer_kernels import fused_add_rms_norm

    g = torch.Generator(device=device).manual_seed(rank)
    xs = [torch.randn(16, HIDDEN, device=device, generator=g).to(torch.bfloat16)
          for _ in range(3)]
    residual = torch.ones(16, HIDDEN, device=device, dtype=torch.bfloat16)

    def step() -> list[torch.Tensor]:
        a_normed, a_summed = fused(xs[0], residual, weight, EPS)
        b_normed, b_summed = fused_add_rms_norm(group.all_reduce(xs[1].clone()), a_summed,
                                                weight, EPS)
        c_normed, c_summed = fused(xs[2], b_summed, weight, EPS)
        return [a_normed, a_summed, b_normed, b_summed, c_normed, c_summed]

    eager = step()
    torch.cuda.synchronize()
    torch.distributed.barrier()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm up on the side stream, as torch's capture recipe does
        torch.cuda.synchronize()
        torch.distributed.barrier()
        with torch.cuda.graph(graph):
            captured = step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    torch.distributed.barrier()
    for n in range(REPLAYS):
        for out in captured:
            out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(captured, eager, strict=True):
            assert torch.equal(got, want), f"replay {n} differs from the eager run"
    torch.distributed.barrier()
