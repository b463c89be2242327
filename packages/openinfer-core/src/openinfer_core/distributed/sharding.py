"""Which slice of a model each tensor-parallel rank holds: pure arithmetic, shared by the model
lines so that every line splits heads, MLP widths and the vocabulary the same way.

Splits are contiguous and as even as possible, earlier ranks taking the larger parts, so rank
0's shard is never smaller than another's (its KV bytes per block are the largest: what the
engine budgets with). Uneven splits are allowed (vLLM and SGLang refuse them): they cost some
balance, not correctness, and they let odd head counts (3, 5) run on 2 ranks."""

from __future__ import annotations

from dataclasses import dataclass

from openinfer_core.errors import ModelConfigError


def split_range(n: int, parts: int, index: int) -> range:
    """Part `index` of `range(n)` cut into `parts` contiguous pieces whose sizes differ by at
    most one, the larger ones first."""
    if not 0 <= index < parts:
        raise ValueError(f"part {index} of {parts} does not exist")
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return range(start, start + base + (index < extra))


@dataclass(frozen=True, slots=True)
class HeadShard:
    """The attention heads one rank computes: global query and KV head indices. Every query
    head's KV head (`h // (num_heads // num_kv_heads)`) is among `kv_heads`, and the local
    query heads per local KV head is a whole number, so the rank runs plain grouped-query
    attention over its shard."""

    q_heads: range
    kv_heads: range


def attention_heads(num_heads: int, num_kv_heads: int, rank: int, size: int) -> HeadShard:
    """Rank `rank`'s heads out of `size` ranks. With no more ranks than KV heads, the KV heads
    are split and each rank takes the whole query group of each of its KV heads; with more,
    each KV head is replicated on `size // num_kv_heads` ranks that split its query group."""
    group = num_heads // num_kv_heads
    if size <= num_kv_heads:
        kv = split_range(num_kv_heads, size, rank)
        return HeadShard(range(kv.start * group, kv.stop * group), kv)
    if size % num_kv_heads:
        raise ModelConfigError(
            f"tensor_parallel_size {size} is more than num_key_value_heads ({num_kv_heads}) "
            f"but not a multiple of it: use at most {num_kv_heads} ranks or a multiple of "
            f"{num_kv_heads}")
    copies = size // num_kv_heads
    if group < copies:
        raise ModelConfigError(
            f"tensor_parallel_size {size} is more than num_attention_heads ({num_heads}): "
            "every rank needs a query head")
    kv_head = rank // copies
    part = split_range(group, copies, rank % copies)
    first = kv_head * group
    return HeadShard(range(first + part.start, first + part.stop),
                     range(kv_head, kv_head + 1))


@dataclass(frozen=True, slots=True)
class VocabShard:
    """The vocabulary rows one rank holds (`rows`), padded with zero rows to `padded` so that
    every rank's logits have the same width (an all-gather needs equal parts)."""

    rows: range
    padded: int


def vocab_shard(vocab_size: int, rank: int, size: int) -> VocabShard:
    """Rank `rank`'s rows of a [vocab_size, H] embedding or LM head: `ceil(V / size)` rows
    each, the last rank's padded."""
    part = -(-vocab_size // size)
    start = min(rank * part, vocab_size)
    return VocabShard(range(start, min(start + part, vocab_size)), part)

