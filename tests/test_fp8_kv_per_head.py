"""Per-head FP8 KV-cache scales (compressed-tensors' `attn_head` strategy: one k and one v scale
per KV head, stored [Hkv, 1, 1]) on CPU, through the torch references: read in the shapes
checkpoints use, sharded over tensor-parallel ranks like the KV heads, and served close to the
fp32 twin. The tiny Qwen3 has 2 layers and 2 KV heads of 4 query heads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import prompt_logits
from test_fp8_kv_cache import PROMPTS, mean_abs_diff, run, with_scales

from openinfer_core.distributed.sharding import attention_heads
from openinfer_core.engine.config import EngineConfig
from openinfer_core.engine.engine import Engine
from openinfer_core.interfaces.attention import KVScales
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_core.weights.kv_scales import read_kv_scales

PREFIXES = [f"model.layers.{n}.self_attn." for n in range(2)]


def per_head_tensors(k: list[float], v: list[float],
                     shape: tuple[int, ...] = (2, 1, 1)) -> dict[str, torch.Tensor]:
    """Both layers' scales under vLLM's / compressed-tensors' `self_attn.k_scale` names."""
    return {f"model.layers.{n}.self_attn.{name}": torch.tensor(values).reshape(shape)
            for n in range(2) for name, values in (("k_scale", k), ("v_scale", v))}


@pytest.mark.parametrize("shape", [(2,), (2, 1), (2, 1, 1), (1, 2)])
def test_per_head_scales_are_read_in_the_shapes_checkpoints_use(qwen3_dir: Path, tmp_path: Path,
                                                               shape: tuple[int, ...]) -> None:
    folder = with_scales(qwen3_dir, tmp_path / "ckpt",
                         per_head_tensors([0.5, 2.0], [4.0, 0.25], shape))
    for layer in read_kv_scales(Checkpoint(folder), PREFIXES, 2):
        assert layer.k.dtype == torch.float32 and layer.k.tolist() == [0.5, 2.0]
        assert layer.v.tolist() == [4.0, 0.25]
        assert layer.per_tensor is None  # FlashInfer's kernels cannot take these


def test_per_head_scales_that_agree_are_per_tensor(qwen3_dir: Path, tmp_path: Path) -> None:
    # One scale per head, all equal (and a k per head beside a per-tensor v): the same as one
    # per layer, so FlashInfer can still run such a cache.
    tensors = per_head_tensors([0.5, 0.5], [4.0, 4.0])
    tensors["model.layers.1.self_attn.v_scale"] = torch.tensor(4.0)
    folder = with_scales(qwen3_dir, tmp_path / "ckpt", tensors)
    assert [s.per_tensor for s in read_kv_scales(Checkpoint(folder), PREFIXES, 2)] == [
        (0.5, 4.0)] * 2


@pytest.mark.parametrize(("size", "kv_heads"), [
    (1, [[0, 1, 2, 3]]), (2, [[0, 1], [2, 3]]), (4, [[0], [1], [2], [3]]),
    (8, [[0], [0], [1], [1], [2], [2], [3], [3]]),
])
def test_ranks_keep_their_kv_heads_scales(size: int, kv_heads: list[list[int]]) -> None:
    # 4 KV heads of 4 query heads: split over up to 4 ranks, replicated past that (each
    # copy on ranks that split its query group), as the k/v projections are.
    scales = KVScales.of(torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    for rank, heads in enumerate(kv_heads):
        shard = attention_heads(16, 4, rank, size)
        assert list(shard.kv_heads) == heads
        mine = scales.heads(shard.kv_heads)
        assert mine.k.tolist() == pytest.approx([0.1 * (h + 1) for h in heads])
        assert mine.v.tolist() == [float(h + 1) for h in heads]
        assert (mine.per_tensor is None) == (len(heads) > 1)


def test_per_head_scales_serve_close_to_the_fp32_twin(qwen3_dir: Path, tmp_path: Path) -> None:
    # Powers of two per head: k / 2^e and v / 2^e round to the mantissas of k and v, so the
    # logprobs are the unscaled e4m3 cache's but near the subnormal and saturation ends (the
    # per-tensor version of this measured 0.001 nats mean), and as far from the fp32 twin as
    # an e4m3 cache is (mean |delta logprob| 0.09 measured there; bound 0.25). A head read
    # with another head's scale is off by 4x to 16x: whole nats.
    unscaled, _ = run(qwen3_dir, "fp8")
    fp32, _ = run(qwen3_dir, "auto")
    folder = with_scales(qwen3_dir, tmp_path / "per-head",
                         per_head_tensors([0.5, 2.0], [4.0, 0.25]))
    per_head, _ = run(folder, "fp8")
    assert 0.0 < mean_abs_diff(per_head, unscaled) < 0.01
    assert 0.01 < mean_abs_diff(per_head, fp32) < 0.25
    agree = torch.cat([(x.argmax(-1) == y.argmax(-1)).float()
                       for x, y in zip(fp32, per_head, strict=True)]).mean()
    assert agree > 0.75


def test_tensor_parallel_ranks_quantize_with_their_own_heads_scales(qwen3_dir: Path,
                                                                    tmp_path: Path) -> None:
    # Scales that matter beyond rounding: 64 on one head flushes its small values toward 0
    # (e4m3's subnormals step by 2^-9 * 64), so swapping the two heads' scales moves the
    # log-probabilities by 0.03-0.06 nats mean (measured). Two ranks, one KV head each, give
    # one rank's log-probabilities up to the all-reduce's summation order (~1e-6 measured),
    # not the swapped scales'.
    right = with_scales(qwen3_dir, tmp_path / "right", per_head_tensors([1.0, 64.0], [64.0, 1.0]))
    swapped = with_scales(qwen3_dir, tmp_path / "swapped",
                          per_head_tensors([64.0, 1.0], [1.0, 64.0]))
    engines = [Engine(EngineConfig(model=str(m), device="cpu", kv_cache_dtype="fp8",
                                   num_kv_blocks=64, tensor_parallel_size=tp))
               for m, tp in ((right, 1), (swapped, 1), (right, 2))]
    try:
        for ids in PROMPTS[:3]:
            one, other, two = (torch.log_softmax(prompt_logits(e, ids), -1) for e in engines)
            moved = float((one - other).abs().mean())
            assert moved > 0.01  # the assignment matters here
            assert float((two - one).abs().mean()) < 0.01 * moved
    finally:
        for e in engines:
            e.close()
