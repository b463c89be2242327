"""What the decode-size kernels read before their PDL wait with `OPENINFER_PDL_PRELOAD`
(`pdl.py`: before `pdl_enter` a kernel may read only what older kernels or the host wrote),
checked under the interpreter.
The wait is stood in for by a function that writes the previous kernel's outputs, NaN until
then, so a kernel that read one of them before its wait carries a NaN (or a wrong value) into
its result. Each launch checked here is one program: the interpreter runs programs one after
another, so a second would find the values already written.

- the split attention kernel at decode: the block table, the earlier steps' keys and values of
  its first tile are read before the wait; q and this step's key and value after it;
- the push all-reduce + add + norm: the residual row and the norm weight before, x after;
- the small-batch linears (bf16 and FP8): their first weight tile (and its scales) before, x
  after, with the same bits as without it.
The ordering on the device is the compiler's: `pdl_reads_ptx_unit.py` checks the loads ahead of
`griddepcontrol.wait` in sm90 PTX."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from paged_cases import Req, build, check, decodes

import openinfer_kernels.attention.split as split_module
import openinfer_kernels.collective.push_triton as push_module
import openinfer_kernels.fp8_linear.triton as fp8_module
import openinfer_kernels.gemm.triton as gemm_module
import openinfer_kernels.pdl as pdl_module
from openinfer_kernels.attention.split import SplitConfig, launch_split
from openinfer_kernels.collective.push_triton import (
    PushAddNorm,
    all_reduce_add_rms_norm_push_triton,
)
from openinfer_kernels.fp8_linear.triton import (
    Fp8Tile,
    fp8_block_linear_silu_mul_triton,
    fp8_block_linear_triton,
)
from openinfer_kernels.gemm.triton import Tile, linear_triton
from openinfer_kernels.pdl import PRELOAD_ENV, PRELOAD_KERNELS, preloads
from openinfer_kernels.testing.compiled_session import run_compiled_session
from openinfer_kernels.testing.ranks import push_memory

from .test_all_reduce_add_norm import EPS, assert_kernel_alike, inputs


class Wait:
    """Stands in for `griddepcontrol.wait`: writes each (tensor, values) pair it holds."""

    def __init__(self) -> None:
        self.fills: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        for target, values in self.fills:
            target.copy_(values)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# The stand-in wait needs the interpreter (compiled, `griddepcontrol.wait` is the hardware's);
# on a GPU the tests that poison the previous kernel's outputs are skipped, and the ordering is
# checked in PTX below. The same-bits tests run everywhere: on a GPU with PDL as it launches.
interpreted = pytest.mark.skipif(not INTERPRETED,
                                 reason="stands in for the PDL wait under the interpreter")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def wait(monkeypatch: pytest.MonkeyPatch) -> Iterator[Wait]:
    """The preloads on; off a GPU, PDL on for the launchers (without the launch attribute,
    which neither the interpreter nor the TTIR check has) and, under the interpreter, the wait
    stood in for."""
    stand_in = Wait()
    if INTERPRETED:
        monkeypatch.setattr(pdl_module, "gdc_wait", stand_in)
        monkeypatch.setattr(pdl_module, "gdc_launch_dependents", lambda: None)
    for module in (split_module, push_module, gemm_module, fp8_module):
        if DEVICE == "cpu":
            monkeypatch.setattr(module, "pdl_launch", lambda _t: {"PDL": True})
        monkeypatch.setattr(module, "PRELOAD", True)
    yield stand_in


@interpreted
@pytest.mark.parametrize("context", [1, 40, 200], ids=["one-key", "first-tile", "later-tile"])
def test_decode_attention_reads_q_and_the_new_key_after_the_wait(wait, context):
    # One request, one KV head, one split: one program. Its new key (position context - 1) is
    # in the first tile the kernel loads before the wait up to 64 keys, in a later tile past.
    case = build([Req(context, 1)], 4, 1, 24, torch.float32, seed=context,
                 cached_upto=[context - 1])
    slot = case.slots[0][-1]
    k_slot = case.k_cache.view(-1, 1, 24)[slot]
    v_slot = case.v_cache.view(-1, 1, 24)[slot]
    q = case.q.clone()
    wait.fills = [(case.q, q), (k_slot, case.keys[0][-1]), (v_slot, case.values[0][-1])]
    case.q.fill_(float("nan"))
    scale = 24**-0.5
    out = launch_split(*case.args(scale), 1, SplitConfig(num_splits=1))
    assert wait.calls == 1
    case.q.copy_(q)
    check(out, case, scale)


def test_decode_attention_with_the_preload_has_the_same_bits_over_splits_and_requests(
        wait, monkeypatch):
    # Many programs: the stand-in writes nothing; every split's first tile goes through the
    # preloaded path, FP8 pages included.
    case = build(decodes(1, 17, 64, 65, 300), 4, 2, 24, torch.bfloat16, seed=5)
    scale = 24**-0.5
    for splits in (1, 3, 16):
        monkeypatch.setattr(split_module, "PRELOAD", False)
        want = launch_split(*case.args(scale), 1, SplitConfig(num_splits=splits))
        monkeypatch.setattr(split_module, "PRELOAD", True)
        got = launch_split(*case.args(scale), 1, SplitConfig(num_splits=splits))
        assert torch.equal(got, want), splits
    k8, v8 = (c.to(torch.float8_e4m3fn) for c in (case.k_cache, case.v_cache))
    k_scale = torch.tensor([0.5, 2.0], device=DEVICE)
    args = (case.q, k8, v8, *case.args(scale)[3:])
    monkeypatch.setattr(split_module, "PRELOAD", False)
    want = launch_split(*args, 1, SplitConfig(num_splits=3), k_scale=k_scale, v_scale=k_scale)
    monkeypatch.setattr(split_module, "PRELOAD", True)
    got = launch_split(*args, 1, SplitConfig(num_splits=3), k_scale=k_scale, v_scale=k_scale)
    assert torch.equal(got, want)


@interpreted
def test_push_add_norm_reads_x_after_the_wait(wait):
    h = 60
    areas, flags, seqs = push_memory(1, h, torch.float32, shared=False, device="cpu",
                                     fill=PushAddNorm("data").area_fill)
    [x], residual, weight = inputs(1, 1, h, torch.float32, seed=4, device="cpu")
    real = x.clone()
    wait.fills = [(x, real)]
    x.fill_(float("nan"))
    got = all_reduce_add_rms_norm_push_triton(x, residual, weight, EPS, areas, flags, seqs[0],
                                              0, "data")
    assert wait.calls == 1
    assert_kernel_alike(got, [real], residual, weight)


def poison_until_the_wait(wait: Wait, x: torch.Tensor) -> None:
    """Under the interpreter, x reads NaN until the stand-in wait writes it back."""
    if INTERPRETED:
        wait.fills = [(x, x.clone())]
        x.fill_(float("nan"))


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("k", [96, 40], ids=["three-tiles", "part-of-a-tile"])
def test_preloaded_linear_reads_x_after_the_wait_with_the_same_bits(wait, monkeypatch, gated,
                                                                   k):
    torch.manual_seed(k)
    n = 8
    x = torch.randn(1, k).to(torch.bfloat16).to(DEVICE)
    w = torch.randn((2 if gated else 1) * n, k).to(torch.bfloat16).to(DEVICE)
    tile = Tile(n, 32, 1, 1)
    monkeypatch.setattr(gemm_module, "PRELOAD", False)
    want = linear_triton(x, w, tile, gated=gated)
    monkeypatch.setattr(gemm_module, "PRELOAD", True)
    poison_until_the_wait(wait, x)
    got = linear_triton(x, w, tile, gated=gated)
    assert wait.calls == (2 if INTERPRETED else 0)  # the launch without the preload waits too
    assert torch.equal(got, want)


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("k", [300, 40], ids=["three-steps", "part-of-a-step"])
def test_preloaded_fp8_linear_reads_x_after_the_wait_with_the_same_bits(wait, monkeypatch,
                                                                       gated, k):
    g = torch.Generator().manual_seed(k)
    n = 16
    x = torch.randn((1, k), generator=g).to(torch.bfloat16).to(DEVICE)
    w = (4 * torch.randn(((2 if gated else 1) * n, k), generator=g)).to(torch.float8_e4m3fn)
    w = w.to(DEVICE)
    scale = torch.randint(120, 131, (1, -(-k // 128)), generator=g,
                          dtype=torch.uint8).to(DEVICE)
    tile = Fp8Tile(1, 2 * n if gated else n, 128)

    def run() -> torch.Tensor:
        if gated:
            return fp8_block_linear_silu_mul_triton(x, w, scale, tile=tile)
        return fp8_block_linear_triton(x, w, scale, tile=tile)

    monkeypatch.setattr(fp8_module, "PRELOAD", False)
    want = run()
    monkeypatch.setattr(fp8_module, "PRELOAD", True)
    poison_until_the_wait(wait, x)
    got = run()
    assert wait.calls == (2 if INTERPRETED else 0)
    assert torch.equal(got, want)


def test_the_switch_names_the_kernels(monkeypatch):
    for raw, on in (("0", set()), ("", set()), ("1", set(PRELOAD_KERNELS)),
                    ("all", set(PRELOAD_KERNELS)), ("fp8", {"fp8"}),
                    ("attention, push", {"attention", "push"})):
        monkeypatch.setenv(PRELOAD_ENV, raw)
        assert {k for k in PRELOAD_KERNELS if preloads(k)} == on, raw
    monkeypatch.delenv(PRELOAD_ENV)
    assert {k for k in PRELOAD_KERNELS if preloads(k)} == {"fp8"}  # the measured default
    monkeypatch.setenv(PRELOAD_ENV, "fp8,lm_head")
    with pytest.raises(ValueError, match="lm_head"):
        preloads("fp8")


def test_the_kernels_compile_with_those_reads_ahead_of_the_wait() -> None:
    run_compiled_session(Path(__file__).with_name("pdl_reads_ptx_unit.py"), min_passed=16)
