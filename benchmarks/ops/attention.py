"""Paged attention at Qwen3-8B heads (32 query / 8 KV heads, head_dim 128, bf16, 16-token
pages): decode, one prompt, a CUDA graph's mixed step, and the attention backends side by side.
Each is checked against `openinfer_kernels.attention.reference.paged_attention_ref`."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from benchmarks.ops.registry import Case, Impl, Work, register_op

HQ, HK, D, PAGE = 32, 8, 128, 16
SCALE = D**-0.5
BF16 = torch.bfloat16
# bf16 output against the fp32 reference: the kernel tests' tolerance.
TOLERANCE = (1.6e-2, 1e-2)
Args = tuple[torch.Tensor, ...]  # q, k_cache, v_cache, block_tables, seq_lens, query_start_loc


def _reference(args: Args) -> torch.Tensor:
    from openinfer_kernels.attention.reference import paged_attention_ref

    return paged_attention_ref(*args, SCALE)


def _kv_bytes(batch: int, context: int) -> int:
    return 2 * batch * context * HK * D * 2


def _causal_flops(queries: int, context: int) -> float:
    """QK^T and PV over the keys each query sees (the last `queries` of `context` tokens)."""
    return 4 * HQ * D * (queries * context - queries * (queries - 1) / 2)


# --- decode --------------------------------------------------------------------------------


def _decode_args(batch: int, length: int) -> Args:
    pages = -(-length // PAGE)
    blocks = batch * pages + 1
    k = torch.randn(blocks, PAGE, HK, D, device="cuda", dtype=BF16)
    v = torch.randn_like(k)
    tables = (torch.randperm(blocks - 1, device="cuda")[: batch * pages] + 1).view(batch, -1)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=BF16)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    starts = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    return q, k, v, tables.int(), seq_lens, starts


def _decode_build(case: Case) -> list[Args]:
    batch, length = case.params["batch"], case.params["length"]
    copies = max(2, min(16, (512 << 20) // _kv_bytes(batch, length)))  # ~0.5 GB: not in L2
    return [_decode_args(batch, length) for _ in range(copies)]


def _paged_decode(args: Args) -> Any:
    from openinfer_kernels.attention.split import paged_decode

    return lambda: paged_decode(*args, SCALE)


def _decode_sweep(case: Case) -> dict[str, Impl]:
    from openinfer_kernels.attention.split import SplitConfig, launch_split, num_splits_for

    default = num_splits_for(case.params["batch"], HK, torch.device("cuda"))
    impls: dict[str, Impl] = {}
    for splits, block_n, warps, stages in itertools.product(
            sorted({default, 2 * default, 4 * default}), (32, 64, 128), (4, 8), (2, 3)):
        if splits > 32:
            continue
        config = SplitConfig(num_splits=splits, block_n=block_n, num_warps=warps,
                             num_stages=stages)
        impls[f"splits={splits} n={block_n} w={warps} s={stages}"] = (
            lambda a, c=config: lambda: launch_split(*a, SCALE, 1, c))
    return impls


register_op(
    "paged_decode",
    doc="decode attention (`paged_decode`, what a graphed decode step runs) against the KV "
        "read floor; --sweep: split counts and tiles",
    cases=[Case(f"b{b}x{n}", {"batch": b, "length": n})
           for b, n in [(1, 4096), (1, 32768), (32, 2048), (128, 3072), (256, 1024)]],
    build=_decode_build,
    impls={"triton": _paged_decode},
    work=lambda c: Work(_causal_flops(1, c.params["length"]) * c.params["batch"],
                        _kv_bytes(c.params["batch"], c.params["length"])),
    reference=_reference, tolerance=TOLERANCE, sweep=_decode_sweep,
)


# --- one prompt -----------------------------------------------------------------------------


def _prompt_args(length: int) -> Args:
    pages = -(-length // PAGE)
    k = torch.randn(pages + 1, PAGE, HK, D, device="cuda", dtype=BF16)
    v = torch.randn_like(k)
    tables = (torch.randperm(pages, device="cuda") + 1).view(1, -1).int()
    q = torch.randn(length, HQ, D, device="cuda", dtype=BF16)
    seq_lens = torch.tensor([length], dtype=torch.int32, device="cuda")
    starts = torch.tensor([0, length], dtype=torch.int32, device="cuda")
    return q, k, v, tables, seq_lens, starts


def _prompt_impls() -> dict[str, Impl]:
    def split(a: Args) -> Any:
        from openinfer_kernels.attention.split import paged_split

        return lambda: paged_split(*a, SCALE, a[0].shape[0])

    def prefill(a: Args) -> Any:
        from openinfer_kernels.attention.prefill import paged_prefill

        return lambda: paged_prefill(*a, SCALE, a[0].shape[0])

    def engine(a: Args) -> Any:
        from openinfer_kernels.attention.triton import paged_attention_triton

        return lambda: paged_attention_triton(*a, SCALE, max_query_len=a[0].shape[0])

    return {"engine": engine, "split": split, "prefill": prefill}


def _prompt_sweep(case: Case) -> dict[str, Impl]:
    from openinfer_kernels.attention.prefill import PrefillConfig, launch_prefill
    from openinfer_kernels.attention.split import SplitConfig, launch_split

    impls: dict[str, Impl] = {}
    for kernel, m, block_n, warps, stages, heavy in itertools.product(
            ("split", "prefill"), (64, 128), (64, 128), (4, 8), (2, 3), (False, True)):
        name = f"{kernel} m={m} n={block_n} w={warps} s={stages}{' heavy' if heavy else ''}"
        if kernel == "split":
            sc = SplitConfig(block_n=block_n, num_warps=warps, num_stages=stages, rows=m,
                             heavy_first=heavy)
            impls[name] = lambda a, c=sc: lambda: launch_split(*a, SCALE, a[0].shape[0], c)
        else:
            pc = PrefillConfig(block_m=m, block_n=block_n, num_warps=warps, num_stages=stages,
                               heavy_first=heavy)
            impls[name] = lambda a, c=pc: lambda: launch_prefill(*a, SCALE, a[0].shape[0], c)
    return impls


register_op(
    "prefill_attention",
    doc="one prompt, its whole context new: the split and prefill kernels and the engine's "
        "pick (causal TFLOP/s); --sweep: their tiles and launch order",
    cases=[Case(f"prompt{n}", {"length": n}) for n in (2048, 8192)],
    build=lambda c: [_prompt_args(c.params["length"])],
    impls=_prompt_impls(),
    work=lambda c: Work(_causal_flops(c.params["length"], c.params["length"]),
                        _kv_bytes(1, c.params["length"])),
    timing="events", reference=_reference, tolerance=TOLERANCE, sweep=_prompt_sweep,
)


# --- a CUDA graph's mixed step --------------------------------------------------------------

BUCKET = 2048  # the graph bucket the steps are padded to, launched as its capture was


def _mixed_args(prompt: int, decodes: int, context: int) -> Args:
    """One prompt of `prompt` new tokens and `decodes` requests of one query over `context`
    keys each, the queries padded to BUCKET tokens."""
    lens = [prompt] + [context] * decodes
    queries = [prompt] + [1] * decodes
    pages = [-(-n // PAGE) for n in lens]
    k = torch.randn(sum(pages) + 1, PAGE, HK, D, device="cuda", dtype=BF16)
    v = torch.randn_like(k)
    order = torch.randperm(sum(pages), device="cuda").int() + 1
    tables = torch.zeros(len(lens), max(pages), dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(pages):
        tables[i, :n] = order[at:at + n]
        at += n
    starts = torch.tensor([0, *itertools.accumulate(queries)], dtype=torch.int32,
                          device="cuda")
    q = torch.randn(BUCKET, HQ, D, device="cuda", dtype=BF16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, k, v, tables, seq_lens, starts


def _mixed_split(a: Args) -> Any:
    from openinfer_kernels.attention.split import paged_split

    return lambda: paged_split(*a, SCALE, BUCKET)


def _mixed_sweep(case: Case) -> dict[str, Impl]:
    from openinfer_kernels.attention.split import SplitConfig, launch_split

    impls: dict[str, Impl] = {}
    for m, stages in itertools.product((64, 128), (2, 3)):
        config = SplitConfig(rows=m, num_stages=stages)
        impls[f"rows={m} s={stages}"] = (
            lambda a, c=config: lambda: launch_split(*a, SCALE, BUCKET, c))
    return impls


def _mixed_work(c: Case) -> Work:
    p, n, ctx = c.params["prompt"], c.params["decodes"], c.params["context"]
    return Work(_causal_flops(p, p) + n * _causal_flops(1, ctx),
                _kv_bytes(1, p) + _kv_bytes(n, ctx))


register_op(
    "mixed_step_attention",
    doc="a 2048-token CUDA graph bucket holding one prompt chunk beside many decodes, through "
        "the split kernel (padding rows make the reference moot: the kernel tests cover them); "
        "--sweep: 64 / 128 rows, 2 / 3 stages",
    cases=[Case(f"p{p}+{n}x{ctx}", {"prompt": p, "decodes": n, "context": ctx})
           for p, n, ctx in ((1024, 512, 1024), (1536, 512, 4096), (256, 512, 2048),
                             (1900, 100, 1024), (2048, 0, 0))],
    build=lambda c: [_mixed_args(c.params["prompt"], c.params["decodes"], c.params["context"])],
    impls={"split": _mixed_split},
    work=_mixed_work, timing="events", sweep=_mixed_sweep,
)


# --- the attention backends -----------------------------------------------------------------


def _backend_step(batch: int, context: int, queries: int) -> tuple[Any, Args]:
    """A step as a backend gets it: its ForwardBatch, this step's q / k / v and the caches."""
    from openinfer_core.interfaces.model import ForwardBatch

    pages = -(-context // PAGE)
    blocks = batch * pages + 1
    k_cache = torch.randn(blocks, PAGE, HK, D, device="cuda", dtype=BF16)
    v_cache = torch.randn_like(k_cache)
    tables = (torch.randperm(blocks - 1, device="cuda")[:batch * pages] + 1).view(batch, -1)
    pos = torch.arange(context - queries, context, device="cuda")
    slots = (tables[:, pos // PAGE] * PAGE + pos % PAGE).flatten()
    t = batch * queries
    fb = ForwardBatch(
        input_ids=torch.zeros(t, dtype=torch.int64, device="cuda"), positions=pos.repeat(batch),
        slot_mapping=slots, query_start_loc=torch.arange(
            0, t + 1, queries, dtype=torch.int32, device="cuda"),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device="cuda"),
        block_tables=tables.int(), logits_indices=torch.arange(
            queries - 1, t, queries, device="cuda"),
        max_query_len=queries, max_seq_len=context)
    q = torch.randn(t, HQ, D, device="cuda", dtype=BF16)
    k = torch.randn(t, HK, D, device="cuda", dtype=BF16)
    return fb, (q, k, torch.randn_like(k), k_cache, v_cache)


def _backend(name: str) -> Impl:
    def impl(step: tuple[Any, Args]) -> Any:
        from openinfer_core.plugins import get_plugin_manager

        if name == "flashinfer":
            try:
                import flashinfer  # noqa: F401
            except ImportError:
                return None
        cls = get_plugin_manager().registries.attention_backends.resolve(name)
        # FlashInfer's kernels on every step, decode included (the backend's default runs
        # decode and short steps on the Triton kernels, from CUDA graphs).
        backend = cls(every_step=True) if name == "flashinfer" else cls()
        fb, (q, k, v, k_cache, v_cache) = step
        return lambda: backend.attend(q, k, v, k_cache, v_cache, fb, SCALE)

    return impl


BACKEND_CASES = {"decode-128x4096": (128, 4096, 1), "decode-1x4096": (1, 4096, 1),
                 "prefill-2048": (1, 2048, 2048), "prefill-8192": (1, 8192, 8192)}

register_op(
    "attention_backends",
    doc="each attention backend's `attend` (K/V append included) on one step, the device "
        "time of its kernels (what a graph replay pays; FlashInfer where installed)",
    cases=[Case(name, {"batch": b, "context": n, "queries": q})
           for name, (b, n, q) in BACKEND_CASES.items()],
    build=lambda c: [_backend_step(c.params["batch"], c.params["context"],
                                   c.params["queries"])],
    impls={"triton": _backend("triton"), "flashinfer": _backend("flashinfer")},
    work=lambda c: Work(c.params["batch"] * _causal_flops(c.params["queries"],
                                                           c.params["context"]),
                        _kv_bytes(c.params["batch"], c.params["context"])),
    timing="kernels",
)
