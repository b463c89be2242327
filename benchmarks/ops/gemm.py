"""Linear layers at Qwen3-4B/8B (and Qwen3.5-4B, DeepSeek-V4-Flash's bf16) shapes: the decode
step's small-batch products (alone, gated, and feeding the residual add + RMSNorm), the prompt
step's products, and the vocabulary projection. Each is checked against the package's references
(`gemm.reference.linear_ref`, `activation.reference.silu_and_mul_ref`,
`norm.reference.fused_add_rms_norm_ref`, `lm_head.reference.lm_head_logits_ref`)."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.ops.registry import Case, Impl, Work, register_op

BF16 = torch.bfloat16
EPS = 1e-6
# name: (N, K) of the weight [N, K]
SMALL_SHAPES = {
    "4B qkv": (6144, 2560), "4B o": (2560, 4096), "4B gate_up": (19456, 2560),
    "4B down": (2560, 9728), "4B lm_head": (151936, 2560),
    "8B qkv": (6144, 4096), "8B o": (4096, 4096), "8B gate_up": (24576, 4096),
    "8B down": (4096, 12288), "8B lm_head": (151936, 4096),
    # one rank's shard at tensor-parallel size 2 (M = 1 only)
    "8B/tp2 qkv": (3072, 4096), "8B/tp2 o": (4096, 2048), "8B/tp2 gate_up": (12288, 4096),
    "8B/tp2 down": (4096, 6144), "32B/tp2 qkv": (5120, 5120), "32B/tp2 o": (5120, 4096),
    "32B/tp2 gate_up": (25600, 5120), "32B/tp2 down": (5120, 12800),
    # and at tensor-parallel size 4
    "8B/tp4 qkv": (1536, 4096), "8B/tp4 o": (4096, 1024), "8B/tp4 gate_up": (6144, 4096),
    "8B/tp4 down": (4096, 3072), "32B/tp4 qkv": (2560, 5120), "32B/tp4 o": (5120, 2048),
    "32B/tp4 gate_up": (12800, 5120), "32B/tp4 down": (5120, 6400),
    # Qwen3.5-4B (its o_proj / out_proj is 4B o's shape)
    "3.5-4B in_proj": (12352, 2560), "3.5-4B qkvg": (10240, 2560),
    "3.5-4B gate_up": (18432, 2560), "3.5-4B down": (2560, 9216),
    "3.5-4B lm_head": (248320, 2560),
    # DeepSeek-V4-Flash's bf16 products (every rank's whole weight): the router, the CSA /
    # HCA / indexer compressors' kv and gate, the indexer's head weights; and as the model
    # runs them, stacked (openinfer_deepseek_v4/shared_input.py): a CSA layer's five products
    # of x in one, an HCA layer's two (the CSA compressor's shape)
    "V4 router": (256, 4096), "V4 csa-compressor": (1024, 4096),
    "V4 hca-compressor": (512, 4096), "V4 indexer-compressor": (256, 4096),
    "V4 indexer-weights": (64, 4096), "V4 csa-stack": (2624, 4096),
}


def _weight_copies(n: int, k: int, seed: int) -> list[torch.Tensor]:
    """The weight and enough copies (1 GB at least) that none is still in L2 when a graph of
    calls over them comes back to it, as in a decode step."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn((n, k), device="cuda", dtype=BF16, generator=g) * 0.02
    return [w] + [w.clone() for _ in range(max(3, -(-(1 << 30) // w.nbytes)) - 1)]


def _tiles(m: int, splits: tuple[int, ...]) -> list[Any]:
    from openinfer_kernels.gemm.triton import Tile

    if m == 1:  # the CUDA-core path: any column count
        grid = itertools.product((4, 8, 16, 32), (256, 512), splits, (4, 8))
    else:  # tl.dot: 16 columns at least
        grid = itertools.product((16, 32, 64), (128, 256), splits, (4,))
    return [Tile(n, k, s, w) for n, k, s, w in grid]


def _tile_name(t: Any) -> str:
    return f"Tile({t.block_n}, {t.block_k}, {t.split_k}, {t.num_warps}, {t.num_stages})"


# --- the decode step's products -------------------------------------------------------------


def _small_cases() -> list[Case]:
    cases = []
    for name, (n, k) in SMALL_SHAPES.items():
        for gated in (False, True) if "gate_up" in name else (False,):
            for m in (1,) if "/tp" in name else (1, 16):
                label = f"{name}{'+silu' if gated else ''} M{m}".replace(" ", "-")
                cases.append(Case(label, {"n": n, "k": k, "m": m, "gated": gated}))
    return cases


def _small_build(case: Case) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    n, k, m = case.params["n"], case.params["k"], case.params["m"]
    x = torch.randn((m, k), device="cuda", dtype=BF16)
    return [(x, w, case.params["gated"]) for w in _weight_copies(n, k, n + k + m)]


def _small_cublas(a: tuple[torch.Tensor, torch.Tensor, bool]) -> Any:
    from openinfer_kernels.activation import silu_and_mul

    x, w, gated = a
    return (lambda: silu_and_mul(F.linear(x, w))) if gated else (lambda: F.linear(x, w))


def _small_engine(a: tuple[torch.Tensor, torch.Tensor, bool]) -> Any:
    from openinfer_kernels.gemm import linear, linear_silu_mul

    x, w, gated = a
    return (lambda: linear_silu_mul(x, w)) if gated else (lambda: linear(x, w))


def _small_reference(a: tuple[torch.Tensor, torch.Tensor, bool]) -> torch.Tensor:
    from openinfer_kernels.activation.reference import silu_and_mul_ref
    from openinfer_kernels.gemm.reference import linear_ref

    x, w, gated = a
    return silu_and_mul_ref(linear_ref(x, w)) if gated else linear_ref(x, w)


def _small_sweep(case: Case) -> dict[str, Impl]:
    from openinfer_kernels.gemm.triton import linear_triton

    # Narrow weights (a few column blocks) need K split further to fill the GPU.
    splits = (1, 2, 4) if case.params["n"] > 1024 else (2, 4, 8, 16)
    return {_tile_name(t): (lambda a, t=t: lambda: linear_triton(a[0], a[1], t, gated=a[2]))
            for t in _tiles(case.params["m"], splits)}


register_op(
    "small_linear",
    doc="a decode step's linear layers (gate_up also fused with its activation): cuBLAS and "
        "the engine's pick (`gemm.linear`, tiles from gemm/tiles.py) against the weight-read "
        "floor; --sweep: every Triton tile (the search behind gemm/tiles.py's TILES)",
    cases=_small_cases(),
    build=_small_build,
    impls={"cublas": _small_cublas, "engine": _small_engine},
    work=lambda c: Work(2 * c.params["m"] * c.params["n"] * c.params["k"],
                        2 * c.params["n"] * c.params["k"]),
    reference=_small_reference, sweep=_small_sweep,
)


# --- o_proj / down feeding the residual add + RMSNorm ----------------------------------------

FUSED_SHAPES = {"4B o": (2560, 4096), "4B down": (2560, 9728),
                "8B o": (4096, 4096), "8B down": (4096, 12288)}
AddNormArgs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _add_norm_build(case: Case) -> list[AddNormArgs]:
    n, k, m = case.params["n"], case.params["k"], case.params["m"]
    g = torch.Generator(device="cuda").manual_seed(n + k + m + 1)
    x = torch.randn((m, k), device="cuda", dtype=BF16, generator=g)
    residual = torch.randn((m, n), device="cuda", dtype=BF16, generator=g)
    norm_w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(BF16)
    return [(x, w, residual, norm_w) for w in _weight_copies(n, k, n + k + m)]


def _add_norm_engine(a: AddNormArgs) -> Any:
    from openinfer_kernels.gemm import linear_add_rms_norm

    return lambda: linear_add_rms_norm(*a, EPS)


def _add_norm_cublas(a: AddNormArgs) -> Any:
    from openinfer_kernels.norm import fused_add_rms_norm

    x, w, residual, norm_w = a
    return lambda: fused_add_rms_norm(F.linear(x, w), residual, norm_w, EPS)


def _add_norm_reference(a: AddNormArgs) -> object:
    from openinfer_kernels.gemm.reference import linear_ref
    from openinfer_kernels.norm.reference import fused_add_rms_norm_ref

    x, w, residual, norm_w = a
    return fused_add_rms_norm_ref(linear_ref(x, w), residual, norm_w, EPS)


def _add_norm_sweep(case: Case) -> dict[str, Impl]:
    """Each tile as `linear_add_rms_norm` would run it: split K, the norm kernel sums the
    shares; no split, the product then the add + norm."""
    from openinfer_kernels.gemm.triton import linear_add_rms_norm_triton, linear_triton
    from openinfer_kernels.norm import fused_add_rms_norm

    def pair(t: Any) -> Impl:
        if t.split_k > 1:
            return lambda a: lambda: linear_add_rms_norm_triton(a[0], a[1], t, a[2], a[3], EPS)
        return lambda a: lambda: fused_add_rms_norm(linear_triton(a[0], a[1], t), a[2], a[3],
                                                     EPS)

    return {_tile_name(t): pair(t) for t in _tiles(case.params["m"], (1, 2, 4, 8))}


register_op(
    "linear_add_norm",
    doc="o_proj / down then the residual add + RMSNorm as the model runs them "
        "(`linear_add_rms_norm`) and on cuBLAS; --sweep: every tile in the form the model "
        "would run it (the search behind gemm/tiles.py's SUM_FUSED_TILES)",
    cases=[Case(f"{name} M{m}".replace(" ", "-"), {"n": n, "k": k, "m": m})
           for name, (n, k) in FUSED_SHAPES.items() for m in (1, 16)],
    build=_add_norm_build,
    impls={"engine": _add_norm_engine, "cublas": _add_norm_cublas},
    work=lambda c: Work(2 * c.params["m"] * c.params["n"] * c.params["k"],
                        2 * c.params["n"] * c.params["k"]),
    reference=_add_norm_reference, sweep=_add_norm_sweep,
)


# --- the prompt step's products ----------------------------------------------------------------

H8, HEADS8, KV_HEADS8, HEAD_DIM, INTER8 = 4096, 32, 8, 128, 12288
PREFILL_SHAPES = {  # name: (K, N)
    "qkv": (H8, (HEADS8 + 2 * KV_HEADS8) * HEAD_DIM), "o": (HEADS8 * HEAD_DIM, H8),
    "gate_up": (H8, 2 * INTER8), "down": (INTER8, H8), "square": (8192, 8192),
}


def _blas(library: str) -> Impl:
    """`F.linear` on `library`. The preference is set when the implementation builds its
    call, not inside the call, so the checked and timed calls run on `library` with no host
    work beyond `F.linear`'s own; the setting is process-wide, and `run.run_op` sets the one
    before back after each implementation."""

    def impl(a: tuple[torch.Tensor, torch.Tensor]) -> Any:
        torch.backends.cuda.preferred_blas_library(library)
        x, w = a
        return lambda: F.linear(x, w)

    return impl


def _prefill_build(case: Case) -> list[tuple[torch.Tensor, torch.Tensor]]:
    t, k, n = case.params["tokens"], case.params["k"], case.params["n"]
    return [(torch.randn(t, k, device="cuda", dtype=BF16),
             torch.randn(n, k, device="cuda", dtype=BF16) * 0.02)]


def _linear_reference(a: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    from openinfer_kernels.gemm.reference import linear_ref

    return linear_ref(*a)


register_op(
    "prefill_linear",
    doc="the prompt step's four products at Qwen3-8B shapes (`F.linear`, as the model calls "
        "it) through each BLAS library torch can pick, and a square 8192 matmul",
    cases=[Case(f"{name}-T{t}", {"tokens": t, "k": k, "n": n})
           for t in (2048, 8192) for name, (k, n) in PREFILL_SHAPES.items()
           if name != "square" or t == 8192],
    build=_prefill_build,
    impls={"cublas": _blas("cublas"), "cublaslt": _blas("cublaslt")},
    work=lambda c: Work(2 * c.params["tokens"] * c.params["k"] * c.params["n"],
                        2 * (c.params["tokens"] * c.params["k"] + c.params["k"] * c.params["n"]
                             + c.params["tokens"] * c.params["n"])),
    timing="events", reference=_linear_reference,
)


# --- a prompt step's o_proj / down with the residual in cuBLAS's epilogue ---------------------

RESIDUAL_SHAPES = {"o_proj": 4096, "down": 12288}  # K; N is Qwen3-8B's hidden size


def _residual_build(case: Case) -> list[AddNormArgs]:
    t, k = case.params["tokens"], case.params["k"]
    norm_w = torch.randn(H8, device="cuda", dtype=BF16)
    return [(torch.randn(t, k, device="cuda", dtype=BF16) / k**0.5,
             torch.randn(H8, k, device="cuda", dtype=BF16),
             torch.randn(t, H8, device="cuda", dtype=BF16), norm_w) for _ in range(3)]


def _residual_epilogue(a: AddNormArgs) -> Any:
    from openinfer_kernels.norm import rms_norm

    x, w, residual, norm_w = a

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        summed = torch.addmm(residual, x, w.t())
        return rms_norm(summed, norm_w, EPS), summed

    return call


register_op(
    "residual_add_norm",
    doc="a prompt step's o_proj / down then the residual add + RMSNorm: the product and the "
        "fused add + norm kernel (what runs), against cuBLAS adding the residual in its "
        "epilogue (`torch.addmm`) then a plain RMSNorm",
    cases=[Case(f"{name}-T{t}", {"tokens": t, "k": k})
           for t in (2048, 8192) for name, k in RESIDUAL_SHAPES.items()],
    build=_residual_build,
    impls={"add_norm": _add_norm_cublas, "addmm_epilogue": _residual_epilogue},
    work=lambda c: Work(2 * c.params["tokens"] * c.params["k"] * H8,
                        2 * (c.params["tokens"] * c.params["k"] + H8 * c.params["k"]
                             + 4 * c.params["tokens"] * H8)),
    reference=_add_norm_reference,
)


# --- the vocabulary projection -----------------------------------------------------------------

VOCAB, H4 = 151936, 2560


def _lm_head_build(case: Case) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(case.params["m"], H4, device="cuda", dtype=BF16),
             torch.randn(VOCAB, H4, device="cuda", dtype=BF16))]


def _lm_head_engine(a: tuple[torch.Tensor, torch.Tensor]) -> Any:
    from openinfer_kernels.lm_head import lm_head_logits

    return lambda: lm_head_logits(*a)


def _lm_head_reference(a: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    from openinfer_kernels.lm_head.reference import lm_head_logits_ref

    return lm_head_logits_ref(*a)


register_op(
    "lm_head",
    doc="the vocabulary projection at Qwen3-4B shapes: a bf16 GEMM then a conversion to "
        "fp32, one GEMM writing fp32 (`torch.mm(out_dtype=float32)`), and the engine's "
        "`lm_head_logits`",
    cases=[Case(f"M{m}", {"m": m}) for m in (1, 4, 16, 64, 256)],
    build=_lm_head_build,
    impls={"bf16_then_float": lambda a: lambda: F.linear(*a).float(),
           "fp32_out": lambda a: lambda: torch.mm(a[0], a[1].t(), out_dtype=torch.float32),
           "engine": _lm_head_engine},
    work=lambda c: Work(2 * c.params["m"] * VOCAB * H4, 2 * VOCAB * H4 + 4 * c.params["m"] * VOCAB),
    timing="events", reference=_lm_head_reference,
)
