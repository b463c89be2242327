# mypy: disable-error-code="no-untyped-def"
"""Programmatic dependent launch (Hopper and later): a kernel launched with it may be scheduled
while the kernel before it in the stream still drains, so its launch and the previous kernel's
tail overlap (in CUDA graphs too). Each such kernel calls `pdl_enter`: it waits there until
the previous kernel has finished and its writes are visible, then lets the next kernel be
scheduled. Before that call a kernel writes nothing and reads nothing the kernel just before
it writes. It may read what older kernels or the host wrote (weights, the step's inputs, the
KV cache of earlier steps), which hides those reads behind the previous kernel: a kernel is
scheduled only once the one before has passed its own `pdl_enter`, so the kernel two back has
finished by then (a kernel launched without PDL lets the next one start when it ends). On by
default where the GPU has it (compute capability 9.0 and later); OPENINFER_PDL=0 turns it off.
Elsewhere `pdl_enter` compiles to nothing.

A weight-streaming kernel may also ask L2 for the first lines of its weights before
`pdl_enter` (`prefetch_rows`, sized by `prefetch_lines`): the DRAM reads then start while the
kernel before it still runs, which at batch 1 is most of a small kernel's latency (an
all-reduce, a norm). `OPENINFER_PDL_PREFETCH_MB` is the most weight bytes one launch asks for
(default 0, off: at 24 MB batch-1 TPOT grew on the H100, Qwen3-4B 3.33 -> 3.58 ms, 8B 5.65 ->
5.92, 8B FP8 3.65 -> 3.71; `gpu_check.sh prefetch`).
`OPENINFER_PDL_PRELOAD` names the decode-size kernels that read before `pdl_enter` what older
kernels wrote (`preloads`): `attention`, the split attention at decode, its step's block table
and its first tile of earlier keys and values (`attention.split`); `push`, the push all-reduce +
add + norm, its residual row and norm weight (`collective.push_triton`); `linear` (bf16,
`gemm.triton`) and `fp8` (`fp8_linear.triton`), the small-batch linears at one row, their first
weight tile and its scales, in registers (no L2 prefetch then); `experts`, DeepSeek-V4's FP4
experts' first launch at decode where its caller says its inputs are settled, everything but
its store (`openinfer_deepseek_v4.kernels.moe.decode`). A comma list, `1` for all, `0` for
none; unset, `DEFAULT_PRELOADS`: those that measured faster kernel by kernel
(`gpu_check.sh preload`).
(The mypy line above: @triton.jit functions annotate only their constexpr parameters.)"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_WANTED = os.environ.get("OPENINFER_PDL", "1") != "0"
PREFETCH_ENV = "OPENINFER_PDL_PREFETCH_MB"
LINE_BYTES = 128  # an L2 line; `prefetch_rows` asks for one per address
MAX_PREFETCHES = 4096  # addresses one program may hold for it (registers)


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_rows(w_ptr, rows, rows_ok, k_start, k_end, stride_row, LINES: tl.constexpr,
                  LINE: tl.constexpr):
    """Ask L2 for the first LINES lines (LINE elements each) of weight rows `rows` from column
    k_start, none at or past k_end (an address outside asks for w_ptr's line again). A hint: no
    register is loaded and a bad address does not fault. LINES = 0 does nothing; any other
    value only where PDL is on (the interpreter has no inline PTX)."""
    if LINES > 0:
        k = k_start + tl.arange(0, LINES) * LINE
        ok = rows_ok[:, None] & (k < k_end)[None, :]
        ptrs = tl.where(ok, w_ptr + rows[:, None].to(tl.int64) * stride_row + k[None, :], w_ptr)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)


def prefetch_budget() -> int:
    """`OPENINFER_PDL_PREFETCH_MB` in bytes (0: no prefetch)."""
    raw = os.environ.get(PREFETCH_ENV, "0")
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"{PREFETCH_ENV}={raw!r}: a number of megabytes (0 turns it "
                         "off)") from None
    return max(0, int(mb * 2**20))


# Read once, as OPENINFER_PDL is: the launchers pass it, so no launch reads the environment.
PREFETCH_BUDGET = prefetch_budget()
PRELOAD_ENV = "OPENINFER_PDL_PRELOAD"
# Each module that reads one names it; `experts` is DeepSeek-V4's FP4 experts at decode.
PRELOAD_KERNELS = ("attention", "push", "linear", "fp8", "experts")
# On unless the variable says otherwise: those that measured faster. The FP8 one-row linears'
# first tile took Qwen3-8B FP8's batch-1 TPOT from 3.80 to 3.59 ms (bf16 5.65 either way);
# the attention's and the bf16 linears' measured no faster or slower (`gpu_check.sh preload`
# with PRELOADS="0 attention fp8 linear", H100).
DEFAULT_PRELOADS = "fp8"


def preloads(kernel: str) -> bool:
    """Whether `OPENINFER_PDL_PRELOAD` (unset: DEFAULT_PRELOADS) names `kernel` (one of
    PRELOAD_KERNELS)."""
    raw = os.environ.get(PRELOAD_ENV, DEFAULT_PRELOADS).strip()
    if raw in ("", "0"):
        return False
    names = set(PRELOAD_KERNELS) if raw in ("1", "all") else {
        name.strip() for name in raw.split(",")}
    if unknown := names - set(PRELOAD_KERNELS):
        raise ValueError(f"{PRELOAD_ENV}={raw!r}: {sorted(unknown)} not among "
                         f"{', '.join(PRELOAD_KERNELS)} (a comma list; 1 for all, 0 for none)")
    return kernel in names


def prefetch_lines(rows: int, elem_bytes: int, k_share: int, programs_per_row: int,
                   block_rows: int, budget: int | None = None) -> int:
    """How many lines of each of its weight rows a program prefetches: a power of two (the
    kernel's arange) within its K share, the launch's budget and `MAX_PREFETCHES`; 0 for none.
    `rows`: the weight's rows; `programs_per_row`: the K shares (split-K); `budget`: bytes a
    launch may ask for (default: `OPENINFER_PDL_PREFETCH_MB` as it reads now)."""
    if budget is None:
        budget = prefetch_budget()
    if budget == 0:
        return 0
    per_row = budget // (rows * programs_per_row * LINE_BYTES)
    share = triton.cdiv(k_share * elem_bytes, LINE_BYTES)
    lines = min(per_row, triton.next_power_of_2(share), MAX_PREFETCHES // block_rows)
    return 0 if lines < 1 else 1 << (lines.bit_length() - 1)


@functools.lru_cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(t: torch.Tensor) -> dict[str, bool]:
    """The keywords for launching a kernel that calls `pdl_enter`, for work on `t`'s device."""
    if _WANTED and t.is_cuda and _capable(t.device.index if t.device.index is not None
                                          else torch.cuda.current_device()):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
