"""`compile_ahead`: inside it a Triton launch compiles and launches nothing; after it the same
launch runs the variant compiled there."""

from __future__ import annotations

import pytest
import torch

from openinfer_kernels.compile_ahead import compile_ahead


@pytest.mark.gpu
def test_launches_inside_only_compile_and_the_variants_are_kept() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(100, device="cuda")
    with compile_ahead(workers=4):
        for block in (128, 256):
            add_one[(1,)](x, 100, BLOCK=block)
        torch.cuda.synchronize()
        assert torch.count_nonzero(x) == 0  # nothing ran
    compiled = add_one.device_caches[torch.cuda.current_device()][0]
    assert len(compiled) == 2 and all(hasattr(k, "run") for k in compiled.values())
    add_one[(1,)](x, 100, BLOCK=128)
    add_one[(1,)](x, 100, BLOCK=256)
    torch.cuda.synchronize()
    assert torch.equal(x, torch.full_like(x, 2.0))
    assert len(compiled) == 2  # nothing compiled again


def test_without_a_gpu_it_changes_nothing() -> None:
    x = torch.zeros(3)
    with compile_ahead():
        x += 1
    assert torch.equal(x, torch.ones(3))
