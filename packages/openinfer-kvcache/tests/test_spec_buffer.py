"""KVCacheSpec sizes (worked out by hand) and the KVBuffer tensors they describe."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from openinfer_kvcache import DEFAULT_BLOCK_SIZE, KVBuffer, KVCacheSpec


@pytest.mark.parametrize(
    ("layers", "kv_heads", "head_dim", "dtype", "block_size", "per_token", "per_block"),
    [
        # 2 (K and V) * 2 layers * 4 heads * 8 dims * 4 bytes = 512
        (2, 4, 8, torch.float32, 4, 512, 2048),
        (2, 4, 8, torch.bfloat16, 4, 256, 1024),
        # Qwen3-0.6B: 28 layers, 8 kv heads, head_dim 128, bf16 -> 112 KiB a token
        (28, 8, 128, torch.bfloat16, 16, 114_688, 1_835_008),
        (1, 1, 1, torch.float32, 1, 8, 8),
    ],
    ids=["fp32", "bf16", "qwen3-0.6b-bf16", "smallest"],
)
def test_bytes(layers, kv_heads, head_dim, dtype, block_size, per_token, per_block):
    spec = KVCacheSpec(layers, kv_heads, head_dim, dtype, block_size)
    assert spec.bytes_per_token == per_token
    assert spec.bytes_per_block == per_block


def test_spec_defaults_and_is_frozen():
    spec = KVCacheSpec(num_layers=1, num_kv_heads=2, head_dim=8, dtype=torch.float32)
    assert spec.block_size == DEFAULT_BLOCK_SIZE == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.block_size = 4  # type: ignore[misc]


@pytest.mark.parametrize("field", ["num_layers", "num_kv_heads", "head_dim", "block_size"])
def test_spec_rejects_non_positive_sizes(field):
    sizes = dict(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4)
    sizes[field] = 0
    with pytest.raises(ValueError, match=field):
        KVCacheSpec(dtype=torch.float32, **sizes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_buffer_tensors(dtype):
    spec = KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=24, dtype=dtype, block_size=4)
    buf = KVBuffer(spec, num_blocks=5, device="cpu")
    assert buf.spec is spec and buf.num_blocks == 5
    assert len(buf.k) == len(buf.v) == 3
    for t in [*buf.k, *buf.v]:
        assert t.shape == (5, 4, 2, 24)
        assert t.dtype == dtype and t.device == torch.device("cpu")
        assert not t.any()
    assert buf.nbytes == 5 * spec.bytes_per_block
    assert buf.nbytes == sum(t.numel() * t.element_size() for t in [*buf.k, *buf.v])


def test_buffer_tensors_do_not_share_memory():
    spec = KVCacheSpec(num_layers=2, num_kv_heads=1, head_dim=8, dtype=torch.float32,
                       block_size=4)
    buf = KVBuffer(spec, num_blocks=3, device="cpu")
    buf.k[0].fill_(1.0)
    assert not buf.k[1].any() and not buf.v[0].any() and not buf.v[1].any()


@pytest.mark.parametrize("num_blocks", [0, 1])
def test_buffer_needs_a_block_besides_padding(num_blocks):
    spec = KVCacheSpec(num_layers=1, num_kv_heads=1, head_dim=8, dtype=torch.float32)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        KVBuffer(spec, num_blocks=num_blocks, device="cpu")
