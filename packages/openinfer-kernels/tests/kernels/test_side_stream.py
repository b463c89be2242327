"""`side_stream`: off the GPU a branch runs in place with no event to wait for; launches on the
side stream take arrival counts of their own (`split_k.lane`); on a GPU, split launches on
both streams at once, eager and captured in a CUDA graph with its fork and join, give what
they give one after the other."""

from __future__ import annotations

import pytest
import torch

from openinfer_kernels import split_k
from openinfer_kernels.fp8_linear import fp8_block_linear
from openinfer_kernels.side_stream import beside, wait_for


def test_off_the_gpu_a_branch_runs_in_place() -> None:
    calls: list[int] = []
    out, event = beside(True, torch.device("cpu"), lambda a, b=0: calls.append(a + b) or a,
                        2, b=3)
    assert (out, event, calls) == (2, None, [5])
    wait_for(None)  # nothing to wait for
    out, event = beside(False, torch.device("cpu"), lambda: 7)
    assert (out, event) == (7, None)


def test_a_lane_has_counts_of_its_own() -> None:
    device = torch.device("cpu")
    main = split_k.split_counters(device)
    with split_k.lane(1):
        side = split_k.split_counters(device)
        assert split_k.counts_for(device, 4) is side
    assert main is not None and side is not None and main is not side
    assert split_k.split_counters(device) is main  # back to lane 0 after the block


def _fp8_weight(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * 8).to(torch.float8_e4m3fn)
    scale = torch.randint(118, 126, (rows // 128, cols // 128), generator=g, dtype=torch.uint8)
    return w.cuda(), scale.cuda()


@pytest.mark.gpu
def test_split_launches_on_both_streams_give_their_serial_results() -> None:
    device = torch.device("cuda")
    w, scale = _fp8_weight(4096, 4096, 1)  # one row: K split, shares summed by the last
    xs = [torch.randn(1, 4096, generator=torch.Generator().manual_seed(s)).to(torch.bfloat16)
          .cuda() for s in (2, 3)]
    want = [fp8_block_linear(x, w, scale) for x in xs]

    def both() -> list[torch.Tensor]:
        side, done = beside(True, device, fp8_block_linear, xs[1], w, scale)
        main = fp8_block_linear(xs[0], w, scale)
        wait_for(done)
        assert done is not None
        return [main, side]

    for _ in range(20):
        got = both()
        torch.cuda.synchronize()
        assert all(torch.equal(g, e) for g, e in zip(got, want, strict=True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = both()
    for _ in range(20):
        for out in captured:
            out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(g, e) for g, e in zip(captured, want, strict=True))
