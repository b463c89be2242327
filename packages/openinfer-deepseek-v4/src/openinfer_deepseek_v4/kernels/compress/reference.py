"""DeepSeek-V4's KV compressor (spec: shared deepseek-v4.md §5.5): every `ratio` tokens of a
sequence become one compressed KV entry, a softmax-gated sum of their projections, taken per
channel over the window's tokens, then RMS-normalised and rotated at the window's first
position. With `overlap` (the ratio-4 layers) each token projects to two halves: entry j pools
the first halves of window j-1's tokens beside the second halves of window j's (eight slots at
ratio 4; window -1 is empty).

This is the whole-sequence form: the entries of a prefix from its projections. (The serving
path keeps the open window's projections per sequence and emits an entry when it closes.)
`compress_pool_ref` is the paged serving form: each token's projections sit in a paged pool,
and a step pools the entries whose windows it closes straight into a paged entry pool."""

from __future__ import annotations

import torch

from openinfer_deepseek_v4.kernels.quant_sim.storage import RowFormat, encode_rows
from openinfer_deepseek_v4.kernels.rotary.reference import rotary_interleaved_ref


def compress_kv_ref(kv: torch.Tensor, gate: torch.Tensor, position_bias: torch.Tensor,
                    norm_weight: torch.Tensor, freqs: torch.Tensor, *, ratio: int,
                    overlap: bool, norm_eps: float) -> torch.Tensor:
    """kv, gate [T, c*d] (x W_kv^T, x W_gate^T; c = 2 with `overlap`, else 1), position_bias
    [ratio, c*d] (added to the gate of a window's i-th token), norm_weight [d], freqs the
    compressed layers' rotary frequencies -> [T // ratio, d] in kv's dtype: one entry per
    complete window, a trailing partial window left out."""
    windows = kv.shape[0] // ratio
    width = kv.shape[1] // (2 if overlap else 1)
    if windows == 0:
        return kv.new_zeros(0, width)
    kv = kv[:windows * ratio].view(windows, ratio, kv.shape[1])
    gate = gate[:windows * ratio].view(windows, ratio, gate.shape[1]) + position_bias
    if overlap:
        # slots [0, ratio): the previous window's first halves; [ratio, 2 ratio): this one's
        # second halves. Window 0 has no previous window: zero values, weight 0.
        prev_kv = torch.cat([kv.new_zeros(1, ratio, width), kv[:-1, :, :width]])
        prev_gate = torch.cat([gate.new_full((1, ratio, width), float("-inf")),
                               gate[:-1, :, :width]])
        kv = torch.cat([prev_kv, kv[:, :, width:]], dim=1)
        gate = torch.cat([prev_gate, gate[:, :, width:]], dim=1)
    starts = torch.arange(windows, device=kv.device) * ratio
    return _entries(kv, gate, norm_weight, norm_eps, starts, freqs)


def _entries(kv: torch.Tensor, gate: torch.Tensor, norm_weight: torch.Tensor,
             norm_eps: float, starts: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """[windows, slots, d] projections pooled over their slots by the softmax of the gates
    (per channel, fp32, then kv's dtype), RMS-normalised, each entry rotated at its window's
    first position `starts`."""
    pooled = (kv * torch.softmax(gate.float(), dim=1).to(kv.dtype)).sum(dim=1).float()
    normed = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + norm_eps)
    return rotary_interleaved_ref((norm_weight.float() * normed).to(kv.dtype), starts, freqs)


def compressor_state(ratio: int, width: int, *, device: torch.device | str = "cpu"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's empty compressor state: (kv, gate) rows [2 * ratio, width] fp32, the
    previous window's tokens then the open one's; gates start at -inf (an empty slot weighs
    nothing)."""
    return (torch.zeros(2 * ratio, width, device=device),
            torch.full((2 * ratio, width), float("-inf"), device=device))


def compress_chunk_ref(kv: torch.Tensor, gate: torch.Tensor, start: int,
                       state: tuple[torch.Tensor, torch.Tensor], position_bias: torch.Tensor,
                       norm_weight: torch.Tensor, freqs: torch.Tensor, *, ratio: int,
                       overlap: bool, norm_eps: float) -> torch.Tensor:
    """`compress_kv_ref` a chunk at a time: the projections of tokens start..start+n-1 ([n,
    c*d] each) enter the sequence's `state` (from `compressor_state`, updated in place), and
    each window they close gives its entry: [closed windows, d] in kv's dtype. Any split of a
    sequence into chunks gives the entries of the whole."""
    state_kv, state_gate = state
    width = kv.shape[1] // (2 if overlap else 1)
    closed = []
    for i in range(kv.shape[0]):
        pos = start + i
        slot = ratio + pos % ratio
        state_kv[slot] = kv[i].float()
        state_gate[slot] = gate[i].float() + position_bias[pos % ratio].float()
        if (pos + 1) % ratio:
            continue
        if overlap:  # the previous window's first halves beside this one's second halves
            pool_kv = torch.cat([state_kv[:ratio, :width], state_kv[ratio:, width:]])
            pool_gate = torch.cat([state_gate[:ratio, :width], state_gate[ratio:, width:]])
        else:
            pool_kv, pool_gate = state_kv[ratio:], state_gate[ratio:]
        closed.append(_entries(pool_kv[None].to(kv.dtype), pool_gate[None], norm_weight,
                               norm_eps, torch.tensor([pos + 1 - ratio], device=kv.device), freqs))
        state_kv[:ratio], state_gate[:ratio] = state_kv[ratio:], state_gate[ratio:]
    if not closed:
        return kv.new_zeros(0, width)
    return torch.cat(closed)


def compress_pool_ref(projections: torch.Tensor, entries: torch.Tensor,
                      position_bias: torch.Tensor, norm_weight: torch.Tensor,
                      freqs: torch.Tensor, projection_tables: torch.Tensor,
                      entry_tables: torch.Tensor, seq_lens: torch.Tensor,
                      query_start_loc: torch.Tensor, max_query_len: int, *, ratio: int,
                      overlap: bool, norm_eps: float, store: RowFormat | None = None) -> None:
    """A step's new entries on the paged cache, written into `entries` (mutated; nothing else
    is). projections [blocks, block_size, 2 c d]: each token's kv | gate row (`compress_kv_ref`'s
    kv and gate side by side), this step's included, at slot table[p // block_size] *
    block_size + p % block_size of position p (table: the request's row of
    `projection_tables`); entries [entry blocks, entries_per_block, d]: entry j in the block
    (through `entry_tables`) of its window's last token (j + 1) ratio - 1, row (that token's
    offset in the block) // ratio. The two tables may differ (the projections in a window KV
    group, the entries in the full one): the projections read are those of the windows that
    close, positions >= first - (2 if overlap else 1) ratio + 1 for a request's first new
    token `first`. Request b (tables [B, max_blocks], seq_lens [B], query_start_loc [B + 1],
    as in a ForwardBatch) adds tokens seq_len - n .. seq_len - 1 (n its new tokens) and gets
    every entry whose window they close, made by `compress_chunk_ref` from its window's rows
    (the window before it too, with `overlap`). With `store`, `entries` holds uint8 rows of
    that format (`kernels/quant_sim/storage.py`): each entry, in the projections' dtype, is
    written as its rounding's codes. max_query_len, the kernel's grid bound, is unused here."""
    del max_query_len
    block_size, per_block = projections.shape[1], entries.shape[1]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        first = seq_len - (starts[b + 1] - starts[b])
        lo, end = first // ratio, seq_len // ratio
        if end <= lo:
            continue
        # The windows of entries lo..end-1 (window lo - 1's rows too, with overlap: entry
        # lo - 1, made on the way from an empty state, is dropped).
        start = (max(lo - 1, 0) if overlap else lo) * ratio
        pos = torch.arange(start, end * ratio, device=projections.device)
        table = projection_tables[b].long()
        rows = projections.flatten(0, 1)[table[pos // block_size] * block_size
                                         + pos % block_size]
        kv, gate = rows.chunk(2, dim=-1)
        state = compressor_state(ratio, kv.shape[1], device=kv.device)
        made = compress_chunk_ref(kv, gate, start, state, position_bias, norm_weight, freqs,
                                  ratio=ratio, overlap=overlap, norm_eps=norm_eps)
        last = torch.arange(lo + 1, end + 1, device=projections.device) * ratio - 1
        slots = (entry_tables[b].long()[last // block_size] * per_block
                 + (last % block_size) // ratio)
        made = made[lo - start // ratio:]
        entries.flatten(0, 1)[slots] = (made.to(entries.dtype) if store is None
                                        else encode_rows(made, store))


def store_projections_ref(kv: torch.Tensor, gate: torch.Tensor, pool: torch.Tensor,
                          slots: torch.Tensor) -> None:
    """A step's compressor projections into their cache rows: kv and gate [T, w] side by side
    (the kv | gate row `compress_pool_ref` reads) into rows `slots` [T] of pool [S, 2 w] (a
    negative slot skips its token), in the pool's dtype; mutates `pool` only."""
    keep = slots >= 0
    pool[slots[keep].long()] = torch.cat([kv, gate], dim=-1)[keep].to(pool.dtype)


def store_and_pool_ref(kv: torch.Tensor, gate: torch.Tensor, slots: torch.Tensor,
                       projections: torch.Tensor, entries: torch.Tensor,
                       position_bias: torch.Tensor, norm_weight: torch.Tensor,
                       freqs: torch.Tensor, projection_tables: torch.Tensor,
                       entry_tables: torch.Tensor, seq_lens: torch.Tensor,
                       query_start_loc: torch.Tensor, max_query_len: int, *, ratio: int,
                       overlap: bool, norm_eps: float, store: RowFormat | None = None) -> None:
    """A step's compressor on the paged cache: `store_projections_ref` of its rows (kv, gate
    [T, c d] into `slots` of the projections [blocks, block_size, 2 c d]), then
    `compress_pool_ref` of the windows that close."""
    store_projections_ref(kv, gate, projections.flatten(0, 1), slots)
    compress_pool_ref(projections, entries, position_bias, norm_weight, freqs,
                      projection_tables, entry_tables, seq_lens, query_start_loc,
                      max_query_len, ratio=ratio, overlap=overlap, norm_eps=norm_eps,
                      store=store)
