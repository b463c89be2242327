"""DeepSeek-V4-Flash's mHC and compressor kernels against their bytes floors: hc_pre and hc_post
at T = 1, 64, 2048 tokens (hidden 4096, N = 4, bf16 streams), beside the torch references on
the same GPU (at T = 1 also over the one-token launch's knobs, `SERIAL_MIN_K_BLOCKS` and
`SERIAL_WARPS` of kernels/mhc/triton.py, and beside it the head's form), and
the compressor's pooling for a decode step of 64 requests (every request closing a window:
the step's worst case; and none: the usual step). A floor is the bytes the op must move (read
+ written) over the copy bandwidth measured in the same run. Each figure is one call's share
of a CUDA graph that runs the op back to back over enough distinct copies of its inputs
(>= 128 MB) that none is still in the 50 MB L2, as across a model's layers.

Usage (on the GPU machine, from the repo root):
    PYTHONPATH=packages/openinfer-kernels/src python benchmarks/device/dsv4_mhc_bench.py"""

from __future__ import annotations

import itertools
from functools import partial

import torch
from cuda_timing import copy_bandwidth, graph_per_call_us

import openinfer_deepseek_v4.kernels.mhc.triton as mhc_triton
from openinfer_deepseek_v4.kernels.compress import compress_pool_ref
from openinfer_deepseek_v4.kernels.compress.triton import compress_pool_triton
from openinfer_deepseek_v4.kernels.mhc import hc_post_ref, hc_pre_ref
from openinfer_deepseek_v4.kernels.mhc.triton import (
    hc_head_triton,
    hc_post_triton,
    hc_pre_triton,
)
from openinfer_deepseek_v4.kernels.rotary import rope_frequencies

N, D, EPS = 4, 4096, 1e-6
HC = dict(hc_eps=EPS, norm_eps=EPS)  # hc_pre's; hc_post's (comb from its logits) below
MIXING = dict(hc_eps=EPS, sinkhorn_iters=20)
# comb's logits: O(1) values from sums of N D products in another order (test_mhc.py's bound)
LOGITS_TOL = dict(rtol=1e-5, atol=1e-5)
COPY_BYTES = 128 << 20


def copies(nbytes: int) -> int:
    return max(2, min(64, -(-COPY_BYTES // max(nbytes, 1))))


def mhc_rows(gbps: float) -> list[tuple[str, float, float, float]]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for t in (1, 64, 2048):
        fn_bytes = (2 + N) * N * N * D * 4
        pre_bytes = t * N * D * 2 + fn_bytes + t * (D * 2 + N * 4 + N * N * 4)
        post_bytes = t * N * D * 2 * 2 + t * D * 2 + t * (N + N * N) * 4
        inputs = []
        for _ in range(copies(pre_bytes)):
            streams = torch.randn(t, N, D, device="cuda", generator=g).bfloat16()
            fn = torch.randn((2 + N) * N, N * D, device="cuda", generator=g) * (N * D) ** -0.5
            inputs.append((streams, fn, torch.randn((2 + N) * N, device="cuda", generator=g),
                           torch.rand(3, device="cuda", generator=g) + 0.5,
                           torch.ones(D, device="cuda", dtype=torch.bfloat16)))
        x, post, comb_logits = hc_pre_triton(*inputs[0], **HC)
        want = hc_pre_ref(*inputs[0], **HC)
        torch.testing.assert_close(x, want[0], rtol=2**-7, atol=2**-4)
        torch.testing.assert_close(comb_logits, want[2], **LOGITS_TOL)
        for name, op in (("hc_pre triton", hc_pre_triton), ("hc_pre torch ref", hc_pre_ref)):
            us = graph_per_call_us([lambda a=a, op=op: op(*a, **HC) for a in inputs])
            rows.append((f"{name} T={t}", us, pre_bytes / gbps * 1e-3, pre_bytes / 1e6))
        if t == 1:  # the one-token launch's knobs (mhc/triton.py), each checked, then timed
            rows += knob_rows(inputs, want, pre_bytes, gbps)
            rows += part_rows(inputs, g, gbps)
        outs = [(a[0], torch.randn(t, D, device="cuda", generator=g).bfloat16(), post, comb_logits)
                for a in inputs]
        torch.testing.assert_close(hc_post_triton(*outs[0], **MIXING),
                                   hc_post_ref(*outs[0], **MIXING), rtol=2**-7, atol=2**-4)
        for name, op in (("hc_post triton", hc_post_triton), ("hc_post torch ref", hc_post_ref)):
            us = graph_per_call_us([lambda a=a, op=op: op(*a, **MIXING) for a in outs])
            rows.append((f"{name} T={t}", us, post_bytes / gbps * 1e-3, post_bytes / 1e6))
        if t == 1:  # comb's Sinkhorn-Knopp, which runs there: one pass in place of 20
            us = graph_per_call_us([lambda a=a: hc_post_triton(*a, hc_eps=EPS, sinkhorn_iters=1)
                                    for a in outs])
            rows.append(("hc_post triton T=1 one Sinkhorn pass", us, post_bytes / gbps * 1e-3,
                         post_bytes / 1e6))
    return rows


def knob_rows(inputs: list[tuple[torch.Tensor, ...]], want: tuple[torch.Tensor, ...],
              nbytes: int, gbps: float) -> list[tuple[str, float, float, float]]:
    """hc_pre at one token for each SERIAL_MIN_K_BLOCKS x SERIAL_WARPS (the defaults
    restored)."""
    rows = []
    knobs = ("SERIAL_MIN_K_BLOCKS", "SERIAL_WARPS")
    defaults = [getattr(mhc_triton, k) for k in knobs]
    try:
        for values in itertools.product((1, 2, 4, 8), (2, 4, 8, 16)):
            for knob, value in zip(knobs, values, strict=True):
                setattr(mhc_triton, knob, value)
            x, _, comb_logits = hc_pre_triton(*inputs[0], **HC)
            torch.testing.assert_close(x, want[0], rtol=2**-7, atol=2**-4)
            torch.testing.assert_close(comb_logits, want[2], **LOGITS_TOL)
            us = graph_per_call_us([lambda a=a: hc_pre_triton(*a, **HC) for a in inputs])
            blocks, warps = values
            rows.append((f"hc_pre T=1 k-blocks {blocks} warps {warps}",
                         us, nbytes / gbps * 1e-3, nbytes / 1e6))
    finally:
        for knob, value in zip(knobs, defaults, strict=True):
            setattr(mhc_triton, knob, value)
    return rows


def part_rows(inputs: list[tuple[torch.Tensor, ...]], g: torch.Generator,
              gbps: float) -> list[tuple[str, float, float, float]]:
    """Beside a one-token hc_pre, the head's form (N mix outputs, no post, no comb logits: the
    projection, the arrival count and the collapse)."""
    rows = []
    heads = [(a[0], torch.randn(N, N * D, device="cuda", generator=g) * (N * D) ** -0.5,
              torch.randn(N, device="cuda", generator=g),
              torch.rand(1, device="cuda", generator=g) + 0.5) for a in inputs]
    head_bytes = N * D * 2 + N * N * D * 4 + D * 2
    rows.append(("hc_head T=1", graph_per_call_us(
        [lambda a=a: hc_head_triton(*a, hc_eps=EPS, norm_eps=EPS) for a in heads]),
        head_bytes / gbps * 1e-3, head_bytes / 1e6))
    return rows


def pool_rows(gbps: float) -> list[tuple[str, float, float, float]]:
    """A decode step of 64 requests, block size 64, contexts ~ 2-3k tokens."""
    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    freqs = rope_frequencies(64, 160000.0, yarn_factor=16, original_max_positions=65536).cuda()
    for name, ratio, overlap, d in (("CSA r4 d512", 4, True, 512),
                                    ("indexer r4 d128", 4, True, 128),
                                    ("HCA r128 d512", 128, False, 512)):
        c, batch, block_size, per_seq = (2 if overlap else 1), 64, 64, 48
        blocks = batch * per_seq
        projections = torch.randn(blocks, block_size, 2 * c * d, device="cuda",
                                  generator=g).bfloat16()
        entries = torch.zeros(blocks, -(-block_size // ratio), d, device="cuda",
                              dtype=torch.bfloat16)
        bias = torch.randn(ratio, c * d, device="cuda", generator=g)
        norm = torch.ones(d, device="cuda", dtype=torch.bfloat16)
        qsl = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
        kw = dict(ratio=ratio, overlap=overlap, norm_eps=EPS)
        for closing in (True, False):
            calls = []
            for _ in range(16):  # each call its own tables: its windows are not in L2
                tables = torch.randperm(blocks, device="cuda", generator=g).view(batch, per_seq)
                lens = torch.randint(2048 // ratio, 3000 // ratio, (batch,), device="cuda",
                                     generator=g) * ratio + (0 if closing else 1)
                tables = tables.to(torch.int32)  # the projections' and the entries' alike
                args = (bias, norm, freqs, tables, tables, lens.to(torch.int32), qsl, 1)
                calls.append(partial(compress_pool_triton, projections, entries, *args, **kw))
            got, want = entries.clone(), entries.clone()
            compress_pool_triton(projections, got, *args, **kw)
            compress_pool_ref(projections, want, *args, **kw)
            torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-5)
            nbytes = batch * (c * ratio * 2 * d * 2 + d * 2) if closing else 0
            us = graph_per_call_us(calls)
            rows.append((f"pool {name} B=64 {'all close' if closing else 'none close'}", us,
                         nbytes / gbps * 1e-3, nbytes / 1e6))
    return rows


def main() -> None:
    gbps = copy_bandwidth() / 1e9
    print(f"{torch.cuda.get_device_name()}: copy {gbps:.0f} GB/s (read + write)", flush=True)
    print(f"{'op':40} {'us':>9} {'floor us':>9} {'MB':>8} {'floor/us':>8}")
    for name, us, floor, mb in mhc_rows(gbps) + pool_rows(gbps):
        print(f"{name:40} {us:9.2f} {floor:9.2f} {mb:8.2f} {floor / us:8.0%}", flush=True)


if __name__ == "__main__":
    main()
