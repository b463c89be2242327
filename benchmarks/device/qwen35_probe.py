"""Qwen3.5 on the GPU, one small piece at a time, each followed by a synchronisation, so that
an illegal memory access is pinned to the first piece that makes one (run it with
CUDA_LAUNCH_BLOCKING=1: the faulting kernel's launch then raises, with its traceback).

1. fla's gated delta rule through `gated_delta_rule_varlen_fla`, at Qwen3.5-4B's linear-layer
   shapes (16 key heads, 32 value heads, 128 x 128), bf16, against the torch reference: decode
   rows, then prompt rows of lengths that are and are not multiples of fla's 64-token chunk.
2. One eager forward after another of a 4-layer Qwen3.5-4B-shaped model (three Gated DeltaNet
   layers and a full-attention one, dummy weights) on the default attention backend: a
   1-token prompt, a 5-token prompt, a 70-token prompt, a mixed step (a prompt chunk beside
   decodes), then decodes.

Usage: python benchmarks/device/qwen35_probe.py [fla|model ...] (default both). Prints one
line a piece; exits 1 at the first failure, after its traceback."""

from __future__ import annotations

import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import torch


def piece(name: str, fn: Callable[[], str]) -> None:
    try:
        detail = fn()
        torch.cuda.synchronize()
    except Exception:
        traceback.print_exc()
        print(f"FAILED {name}", flush=True)
        sys.exit(1)
    # A piece that ran but gave NaN (diffs of nan, non-finite logits) is named, not passed.
    wrong = "nan" in detail or "finite False" in detail
    print(f"{'WRONG' if wrong else 'ok'} {name} {detail}", flush=True)


def fla_pieces() -> None:
    from openinfer_qwen35.kernels.gated_delta_rule import gated_delta_rule_varlen_ref
    from openinfer_qwen35.kernels.gated_delta_rule.fla import (
        ChunkPlan,
        gated_delta_rule_varlen_fla,
    )

    heads, value_heads, dim = 16, 32, 128

    def run(lengths: list[int], decode: bool) -> str:
        gen = torch.Generator(device="cuda").manual_seed(0)
        t, rows = sum(lengths), len(lengths)

        def r(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device="cuda").bfloat16()

        q, k, v = r(t, heads, dim), r(t, heads, dim), r(t, value_heads, dim)
        g = -torch.rand(t, value_heads, generator=gen, device="cuda")
        beta = torch.rand(t, value_heads, generator=gen, device="cuda").bfloat16()
        qsl = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
        states = torch.randn(rows + 3, value_heads, dim, dim, generator=gen, device="cuda")
        slots = torch.arange(rows, device="cuda") + 2
        fresh = torch.arange(rows, device="cuda") % 2 == 0
        ref_states = states.clone()
        want = gated_delta_rule_varlen_ref(q, k, v, g, beta, ref_states, slots, fresh, qsl,
                                           decode=decode)
        plan = None if decode else ChunkPlan.of(qsl, qsl.cpu())
        got = gated_delta_rule_varlen_fla(q, k, v, g, beta, states, slots, fresh, qsl,
                                          decode=decode, plan=plan)
        torch.cuda.synchronize()
        return (f"max|out diff| {(got.float() - want.float()).abs().max().item():.3g} "
                f"max|state diff| {(states - ref_states).abs().max().item():.3g}")

    piece("fla decode B=1", lambda: run([1], True))
    piece("fla decode B=5", lambda: run([1] * 5, True))
    for lengths in ([64], [128], [64, 64], [63], [2], [1], [65], [1, 70, 5],
                    [128, 1, 1, 33], [96] * 8 + [1] * 40):
        piece(f"fla chunk {lengths if len(lengths) < 10 else f'{len(lengths)} rows'}",
              lambda lengths=lengths: run(lengths, False))


def decode_timing() -> None:
    """One linear layer's decode work after its in-projection, at Qwen3.5-4B's shapes, in a
    CUDA graph of 24 layers' worth (each on its own state, as in the model): fla's path (the
    torch convolution, the gates in torch, the state gathered, fla's fused recurrent kernel,
    the state scattered back) against ours (`causal_conv1d_decode`, then
    `gated_delta_rule_decode` with the gates inside). Prints microseconds per layer."""
    import torch.nn.functional as F
    from cuda_timing import graph_per_call_us

    from openinfer_qwen35.kernels.gated_delta_rule.decode_triton import gated_delta_rule_decode
    from openinfer_qwen35.kernels.gated_delta_rule.fla import gated_delta_rule_varlen_fla
    from openinfer_qwen35.kernels.short_conv import causal_conv1d_ref
    from openinfer_qwen35.kernels.short_conv.decode_triton import causal_conv1d_decode

    hk, hv, dk, dv, taps, layers = 16, 32, 128, 128, 4, 24
    channels = 2 * hk * dk + hv * dv

    def time_rows(rows: int) -> None:
        slots = torch.arange(rows, device="cuda") + 1
        fresh = torch.zeros(rows, dtype=torch.bool, device="cuda")
        qsl = torch.arange(rows + 1, device="cuda", dtype=torch.int32)
        proj = torch.randn(layers, rows, channels + 2 * hv, device="cuda").bfloat16()
        weight = torch.randn(channels, taps, device="cuda").bfloat16()
        conv = torch.randn(layers, rows + 1, channels, taps - 1, device="cuda").bfloat16()
        state = torch.randn(layers, rows + 1, hv, dk, dv, device="cuda") * 0.01
        a_neg = -torch.rand(hv, device="cuda")
        dt_bias = torch.randn(hv, device="cuda").bfloat16()

        def theirs(n: int) -> None:
            mixed = causal_conv1d_ref(proj[n, :, :channels], weight, conv[n], slots, qsl, fresh)
            q, k, v = mixed.split([hk * dk, hk * dk, hv * dv], dim=-1)
            b, a = proj[n, :, channels:channels + hv], proj[n, :, channels + hv:]
            g = a_neg * F.softplus(a.float() + dt_bias)
            gated_delta_rule_varlen_fla(q.reshape(rows, hk, dk), k.reshape(rows, hk, dk),
                                        v.reshape(rows, hv, dv), g, b.sigmoid(), state[n],
                                        slots, fresh, qsl, decode=True)

        def ours(n: int) -> None:
            mixed = causal_conv1d_decode(proj[n, :, :channels], weight, conv[n], slots, fresh)
            b, a = proj[n, :, channels:channels + hv], proj[n, :, channels + hv:]
            gated_delta_rule_decode(mixed, a, b, a_neg, dt_bias, state[n], slots, fresh, hk)

        fla_us = graph_per_call_us([lambda n=n: theirs(n) for n in range(layers)])
        ours_us = graph_per_call_us([lambda n=n: ours(n) for n in range(layers)])
        moved = 2 * state[0, :rows].nbytes
        print(f"decode layer rows {rows}: fla path {fla_us:.1f} us, ours {ours_us:.1f} us "
              f"(state read+written {moved / 1e6:.1f} MB: {moved / ours_us / 1e3:.0f} GB/s)",
              flush=True)

    for rows in (1, 8, 64, 256):
        time_rows(rows)


def model_pieces() -> None:
    from openinfer_core.interfaces.model import ForwardBatch, LoadOptions
    from openinfer_core.model_config import read_model_config
    from openinfer_kernels.attention.triton_backend import TritonAttentionBackend
    from openinfer_qwen35.model_line import Qwen35ModelLine
    from openinfer_qwen35.shapes import write_config_folder

    folder = write_config_folder("Qwen3.5-4B", Path(tempfile.mkdtemp()) / "q35", layers=4)
    options = LoadOptions(device=torch.device("cuda"), dtype=torch.bfloat16,
                          attention=TritonAttentionBackend(), load_format="dummy",
                          max_model_len=1024)
    model = Qwen35ModelLine.load(folder, read_model_config(folder), options)
    block, num_blocks, num_slots = 16, 256, 9
    model.allocate_caches(num_blocks, block, num_slots)
    free_blocks = list(range(num_blocks - 1, 0, -1))
    reqs: dict[str, dict[str, object]] = {}

    def step(rows: list[tuple[str, int]]) -> str:
        ids, positions, slot_map, lens, tables, states = [], [], [], [], [], []
        for rid, n in rows:
            req = reqs.setdefault(rid, {"slot": len(reqs) + 1, "blocks": [], "done": 0})
            blocks: list[int] = req["blocks"]  # type: ignore[assignment]
            start = int(req["done"])  # type: ignore[call-overload]
            while len(blocks) * block < start + n:
                blocks.append(free_blocks.pop())
            for pos in range(start, start + n):
                ids.append(pos % 1000 + 10)
                positions.append(pos)
                slot_map.append(blocks[pos // block] * block + pos % block)
            lens.append(start + n)
            tables.append(list(blocks))
            states.append([req["slot"]])
            req["done"] = start + n
        width = max(len(t) for t in tables)
        cpu_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                  dtype=torch.int32)
        qsl = torch.tensor([0] + [n for _, n in rows], dtype=torch.int32).cumsum(0)
        qsl = qsl.to(torch.int32)
        dev = torch.device("cuda")
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, device=dev),
            positions=torch.tensor(positions, device=dev),
            slot_mapping=torch.tensor(slot_map, device=dev), query_start_loc=qsl.to(dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            block_tables=cpu_tables.to(dev), logits_indices=(qsl[1:].long() - 1).to(dev),
            max_query_len=max(n for _, n in rows), max_seq_len=max(lens),
            query_start_loc_cpu=qsl, seq_lens_cpu=torch.tensor(lens, dtype=torch.int32),
            block_tables_cpu=cpu_tables,
            group_block_tables=(cpu_tables.to(dev),
                                torch.tensor(states, dtype=torch.int32, device=dev)))
        with torch.inference_mode():
            logits = model.forward(batch)
        torch.cuda.synchronize()
        return f"logits {tuple(logits.shape)} finite {bool(logits.isfinite().all())}"

    piece("model prompt 1", lambda: step([("a", 1)]))
    piece("model decode 1", lambda: step([("a", 1)]))
    piece("model prompt 5", lambda: step([("b", 5)]))
    piece("model prompt 70", lambda: step([("c", 70)]))
    piece("model prompt 128", lambda: step([("d", 128)]))
    piece("model mixed", lambda: step([("e", 33), ("a", 1), ("b", 1), ("c", 1)]))
    piece("model decode 4 rows", lambda: step([("a", 1), ("b", 1), ("c", 1), ("e", 1)]))


def main() -> None:
    import importlib

    import triton

    # The wrapper first: it sets fla's dispatch switch before fla imports, as in the engine.
    importlib.import_module("openinfer_qwen35.kernels.gated_delta_rule.fla")
    fla = importlib.import_module("fla")
    print(f"torch {torch.__version__} triton {triton.__version__} fla {fla.__version__} "
          f"{torch.cuda.get_device_name()}", flush=True)
    wanted = sys.argv[1:] or ["fla", "timing", "model"]
    if "fla" in wanted:
        fla_pieces()
    if "timing" in wanted:
        piece("decode timing", lambda: decode_timing() or "")
    if "model" in wanted:
        model_pieces()


if __name__ == "__main__":
    main()
