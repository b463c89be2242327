"""The cache's quantized rows (`kernels/quant_sim/storage.py`, `storage_triton.py`): read back,
a stored row is exactly the official rounding of the values it was made from, so storing is
the rounding (`quant_sim.py`); and the kernels that write (`compress_pool`) and read
(`sparse_sink_attention`, `indexer_topk_paged`) such rows give what they give on the rounded
values in the model's dtype, exactly.

The Triton rows equal the reference's byte for byte, but for the indexer keys' rotation: an
fp32 product summed in another order than torch's, so a key within that noise of a midpoint may
take the other code (`test_quant_sim_kernels.py` bounds those); against the rounding kernel
itself (the same product) they are equal."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.compress import compress_pool_ref
from openinfer_deepseek_v4.kernels.compress.triton import compress_pool_triton
from openinfer_deepseek_v4.kernels.indexer import indexer_topk_paged_ref
from openinfer_deepseek_v4.kernels.indexer.triton import indexer_topk_paged_triton
from openinfer_deepseek_v4.kernels.quant_sim import (
    fp8_round_nope,
    fp8_round_rows_ref,
    indexer_round_ref,
    indexer_round_rows_ref,
)
from openinfer_deepseek_v4.kernels.quant_sim.storage import (
    Fp4Keys,
    Fp8Entries,
    decode_rows,
    encode_rows,
)
from openinfer_deepseek_v4.kernels.quant_sim.storage_triton import (
    decode_rows_triton,
    encode_rows_triton,
)
from openinfer_deepseek_v4.kernels.quant_sim.triton import (
    fp8_round_rows_triton,
    indexer_round_rows_triton,
    indexer_round_triton,
)
from openinfer_deepseek_v4.kernels.sparse_attention import sparse_sink_attention_ref
from openinfer_deepseek_v4.kernels.sparse_attention.triton import (
    prompt_tile,
    sparse_sink_attention_triton,
)
from openinfer_kernels.device import sm_count

# The kernels run compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def spread(rows: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows, each of its own magnitude from 1e-6 to 1e3, with zeros and ties."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * torch.logspace(-6, 3, rows)[:, None]
    x[0] = 0.0
    x[1, : dim // 2] = 448.0 * 2.0 ** -8  # on the FP8 grid: kept
    return x.to(dtype).to(DEVICE)


def test_v4_flash_row_sizes() -> None:
    """584 bytes an entry (448 e4m3 + 64 bf16 rotary + 7 scale bytes, padded to 8), 68 a key
    (128 e2m1 two to a byte + 4 scale bytes), against 1,024 and 256 in bf16."""
    assert Fp8Entries(512, 64, 2).row_bytes == 584
    assert Fp4Keys(128).row_bytes == 68
    assert Fp8Entries(512, 64, 4).row_bytes == 712  # fp32 (the tests' models)


@DTYPES
@pytest.mark.parametrize(("dim", "rope"), [(512, 64), (192, 64), (80, 16)])
def test_stored_entries_read_back_as_the_rounding(dtype: torch.dtype, dim: int,
                                                  rope: int) -> None:
    x = spread(48, dim, dtype, seed=dim)
    fmt = Fp8Entries(dim, rope, x.element_size())
    rows = encode_rows(x, fmt)
    assert rows.dtype == torch.uint8 and rows.shape == (48, fmt.row_bytes)
    want = fp8_round_nope(x, rope)
    assert torch.equal(decode_rows(rows, fmt, dtype), want)
    assert not torch.equal(want, x)  # the rounding moved something
    triton_rows = encode_rows_triton(x, fmt)
    assert torch.equal(triton_rows, rows)
    assert torch.equal(decode_rows_triton(rows, fmt, dtype), want)


@DTYPES
@pytest.mark.parametrize("dim", [128, 64, 32])
def test_stored_keys_read_back_as_the_rounding(dtype: torch.dtype, dim: int) -> None:
    x = spread(48, dim, dtype, seed=dim)
    fmt = Fp4Keys(dim)
    rows = encode_rows(x, fmt)
    triton_rows, triton_read = encode_rows_triton(x, fmt), decode_rows_triton(rows, fmt, dtype)
    assert rows.shape == (48, fmt.row_bytes)
    want = indexer_round_ref(x)
    assert torch.equal(decode_rows(rows, fmt, dtype), want)
    assert torch.equal(triton_read, want)
    # the kernel's rotation is the rounding kernel's: equal to it
    assert torch.equal(decode_rows(triton_rows, fmt, dtype), indexer_round_triton(x))


def test_entry_format_needs_whole_blocks() -> None:
    with pytest.raises(ValueError, match="blocks of 64"):
        Fp8Entries(96, 16, 2)
    with pytest.raises(ValueError, match="power-of-two"):
        Fp4Keys(96)


def _pool_case(dtype: torch.dtype, d: int, ratio: int, overlap: bool, seed: int
               ) -> tuple[tuple[torch.Tensor, ...], dict[str, object], int]:
    """A paged compressor step: 3 requests (a prefill, a chunk, a decode) on shuffled blocks
    of 4 tokens; the pooling's arguments after the entry pool, its keywords, the pool's
    blocks."""
    g = torch.Generator().manual_seed(seed)
    c, block_size, lens, new = (2 if overlap else 1), 4, [23, 16, 9], [23, 3, 1]
    blocks = 16
    projections = torch.randn(blocks, block_size, 2 * c * d, generator=g).to(dtype)
    order = (torch.randperm(blocks - 1, generator=g) + 1).to(torch.int32)
    tables = torch.stack([order[0:6], order[6:12], torch.cat([order[12:15], order[:3]])])
    freqs = torch.rand(8, generator=g) * 0.1
    args = (projections, torch.randn(ratio, c * d, generator=g),
            (1 + 0.5 * torch.randn(d, generator=g)).to(dtype), freqs, tables, tables,
            torch.tensor(lens, dtype=torch.int32),
            torch.tensor([0, *new]).cumsum(0).to(torch.int32))
    return (tuple(a.to(DEVICE) for a in args), dict(ratio=ratio, overlap=overlap,
                                                     norm_eps=1e-6), blocks)


@DTYPES
@pytest.mark.parametrize(("kind", "ratio", "overlap"),
                         [("entries", 4, True), ("entries", 8, False), ("keys", 4, True)])
def test_pooling_stores_the_rounded_entries(dtype: torch.dtype, kind: str, ratio: int,
                                            overlap: bool) -> None:
    """`compress_pool` with a row format writes, in the rows it closes, exactly what pooling
    in the model's dtype then rounding those rows in place gives; the reference likewise."""
    fmt: Fp8Entries | Fp4Keys = Fp4Keys(32)
    if kind == "entries":  # 64 non-rotary dims, 16 rotary
        fmt = Fp8Entries(80, 16, torch.empty((), dtype=dtype).element_size())
    d = fmt.dim
    args, options, blocks = _pool_case(dtype, d, ratio, overlap, seed=ratio + d)
    per_block = -(-4 // ratio)
    for kernel, round_rows in (
            (compress_pool_ref,
             fp8_round_rows_ref if kind == "entries" else indexer_round_rows_ref),
            (compress_pool_triton,
             fp8_round_rows_triton if kind == "entries" else indexer_round_rows_triton)):
        plain = torch.zeros(blocks, per_block, d, dtype=dtype, device=DEVICE)
        kernel(args[0], plain, *args[1:], 23, **options)
        stored = torch.zeros(blocks, per_block, fmt.row_bytes, dtype=torch.uint8, device=DEVICE)
        kernel(args[0], stored, *args[1:], 23, **options, store=fmt)
        written = plain.flatten(0, 1).ne(0).any(-1).nonzero()[:, 0]
        assert written.numel() >= 3
        if kind == "entries":
            round_rows(plain.flatten(0, 1), written, 16)
        else:
            round_rows(plain.flatten(0, 1), written)
        got = decode_rows(stored.flatten(0, 1)[written], fmt, dtype)
        assert torch.equal(got, plain.flatten(0, 1)[written])
        others = torch.ones(blocks * per_block, dtype=torch.bool, device=DEVICE)
        others[written] = False
        assert not stored.flatten(0, 1)[others].any()  # no other row written


@DTYPES
@pytest.mark.parametrize("splits", [1, 3])
def test_attention_reads_fp8_entries_as_their_values(dtype: torch.dtype, splits: int) -> None:
    """Over an entry pool stored in FP8, attention gives exactly what it gives over the same
    entries decoded into the model's dtype (the kernel and the reference alike)."""
    g = torch.Generator().manual_seed(splits)
    tokens, heads, dim, rope = 3, 4, 160, 32
    fmt = Fp8Entries(dim, rope, torch.empty((), dtype=dtype).element_size())
    q = torch.randn(tokens, heads, dim, generator=g).to(dtype).to(DEVICE)
    kv_pool = torch.randn(20, dim, generator=g).to(dtype).to(DEVICE)
    stored = encode_rows(torch.randn(30, dim, generator=g).to(dtype).to(DEVICE), fmt)
    decoded = decode_rows(stored, fmt, dtype)
    window = torch.randint(-1, 20, (tokens, 7), generator=g, dtype=torch.int32).to(DEVICE)
    picked = torch.randint(-1, 30, (tokens, 70), generator=g, dtype=torch.int32).to(DEVICE)
    sinks = torch.randn(heads, generator=g).to(DEVICE)
    args = (window, picked, sinks, dim ** -0.5)
    want = sparse_sink_attention_triton(q, kv_pool, decoded, *args, num_splits=splits)
    got = sparse_sink_attention_triton(q, kv_pool, stored, *args, num_splits=splits,
                                       entry_format=fmt)
    assert torch.equal(got, want)
    assert torch.equal(sparse_sink_attention_ref(q, kv_pool, stored, *args, entry_format=fmt),
                       sparse_sink_attention_ref(q, kv_pool, decoded, *args))


def test_attention_over_fp8_entries_at_the_prompt_tile() -> None:
    """The prompt tile that FP8 entries take at a TP2 rank's 32 heads (`prompt_tile`: 64 heads
    a program, half of them masked, 32 entries a tile) gives exactly what the same tile gives
    over the decoded entries, and the reference's values. (The tile is named: the plan takes
    it only from a step of 2 tokens an SM, more than this test's on a GPU.)"""
    device = torch.device(DEVICE)
    tile = prompt_tile(2 * sm_count(device), 32, device, fp8_entries=True)
    assert tile == (64, 32, 8)
    g = torch.Generator().manual_seed(5)
    tokens, heads, dim, rope = 8, 32, 512, 64
    fmt = Fp8Entries(dim, rope, 2)
    q = torch.randn(tokens, heads, dim, generator=g).to(torch.bfloat16).to(DEVICE)
    kv_pool = torch.randn(24, dim, generator=g).to(torch.bfloat16).to(DEVICE)
    stored = encode_rows(torch.randn(40, dim, generator=g).to(torch.bfloat16).to(DEVICE), fmt)
    decoded = decode_rows(stored, fmt, torch.bfloat16)
    window = torch.randint(-1, 24, (tokens, 9), generator=g, dtype=torch.int32).to(DEVICE)
    picked = torch.randint(-1, 40, (tokens, 50), generator=g, dtype=torch.int32).to(DEVICE)
    sinks = torch.randn(heads, generator=g).to(DEVICE)
    args = (window, picked, sinks, dim ** -0.5)
    named = {"block_h": tile[0], "block_n": tile[1], "num_warps": tile[2], "num_splits": 1}
    got = sparse_sink_attention_triton(q, kv_pool, stored, *args, entry_format=fmt, **named)
    want = sparse_sink_attention_triton(q, kv_pool, decoded, *args, **named)
    assert torch.equal(got, want)
    torch.testing.assert_close(got.float(), sparse_sink_attention_ref(
        q, kv_pool, decoded, *args).float(), atol=2e-2, rtol=2e-2)


@DTYPES
def test_indexer_reads_fp4_keys_as_their_values(dtype: torch.dtype) -> None:
    """The paged indexer over keys stored in FP4 picks what it picks over the decoded keys."""
    g = torch.Generator().manual_seed(1)
    dim, heads, block_size, ratio = 64, 4, 16, 4
    fmt = Fp4Keys(dim)
    stored = encode_rows(torch.randn(24 * 4, dim, generator=g).to(dtype), fmt)
    decoded = decode_rows(stored, fmt, dtype)
    tables = (torch.randperm(23, generator=g)[:12] + 1).to(torch.int32).view(2, 6)
    step = dict(q=torch.randn(4, heads, dim, generator=g).to(dtype),
                weights=torch.randn(4, heads, generator=g),
                block_tables=tables, query_start_loc=torch.tensor([0, 1, 4], dtype=torch.int32),
                positions=torch.tensor([60, 70, 71, 72]))
    step = {k: v.to(DEVICE) for k, v in step.items()}
    options = dict(ratio=ratio, block_size=block_size, top_k=5, softmax_scale=0.125,
                   weights_scale=0.5)
    for op in (indexer_topk_paged_ref, indexer_topk_paged_triton):
        want = op(index_pool=decoded.view(24, 4, dim).to(DEVICE), **step, **options)
        got = op(index_pool=stored.view(24, 4, fmt.row_bytes).to(DEVICE), **step, **options,
                 key_format=fmt)
        assert torch.equal(got, want)
        assert (want >= 0).all()
    # The Triton scores in blocks of 2 tokens (a prompt's), each block's FP4 keys decoded once.
    got = indexer_topk_paged_triton(index_pool=stored.view(24, 4, fmt.row_bytes).to(DEVICE),
                                    **step, **options, key_format=fmt, tokens=2)
    assert torch.equal(got, want)
