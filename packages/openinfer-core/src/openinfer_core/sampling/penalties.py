"""Logit edits that happen before any filtering: repetition, frequency and presence penalties,
and banned token ids.

Both functions MUTATE the logits tensor they are given; the sampler passes its own copy. They
touch only the rows that ask for the edit, so a batch where nobody uses penalties pays nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from openinfer_core.sampling.sampler import SamplingRow


def _scatter_index(
    token_lists: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) index pairs, one per token, so a whole batch is edited with one index_put."""
    lengths = torch.tensor([len(t) for t in token_lists], dtype=torch.long)
    cols = torch.tensor(list(itertools.chain.from_iterable(token_lists)), dtype=torch.long)
    rows = torch.repeat_interleave(torch.arange(len(token_lists)), lengths)
    return rows.to(device), cols.to(device)


def _output_counts(
    token_lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """How often each vocabulary id occurs in each row's list, as fp32 [rows, vocab]."""
    counts = torch.zeros(len(token_lists), vocab_size, dtype=torch.float32, device=device)
    rows, cols = _scatter_index(token_lists, device)
    counts.index_put_((rows, cols), torch.ones_like(cols, dtype=torch.float32), accumulate=True)
    return counts


def _presence(
    token_lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """Whether each vocabulary id occurs in each row's list, as bool [rows, vocab]."""
    present = torch.zeros(len(token_lists), vocab_size, dtype=torch.bool, device=device)
    rows, cols = _scatter_index(token_lists, device)
    present[rows, cols] = True
    return present


def apply_penalties(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Apply vLLM's three penalties in place to the rows whose params ask for any.

    repetition_penalty r, over ids seen in the prompt or the output: positive logits are divided
    by r and the rest multiplied, so r > 1 always makes a seen token less likely.
    frequency_penalty f and presence_penalty p, over output ids only:
    logit -= f * count + p * (count > 0).
    """
    picked = [i for i, row in enumerate(rows) if row.params.has_penalties]
    if not picked:
        return
    device = logits.device
    vocab_size = logits.shape[-1]
    params = [rows[i].params for i in picked]
    outputs = [rows[i].output_token_ids for i in picked]
    prompts = [rows[i].prompt_token_ids for i in picked]

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)

    rep = column([p.repetition_penalty for p in params])
    freq = column([p.frequency_penalty for p in params])
    pres = column([p.presence_penalty for p in params])

    sub = logits[picked]  # advanced indexing copies; written back below
    counts = _output_counts(outputs, vocab_size, device)
    in_output = counts > 0
    seen = _presence(prompts, vocab_size, device) | in_output
    penalised = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen, penalised, sub)
    sub = sub - freq * counts - pres * in_output.to(torch.float32)
    logits[picked] = sub


def apply_banned(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Set each row's banned ids to -inf in place, so neither greedy nor sampling can pick them."""
    picked = [i for i, row in enumerate(rows) if row.banned_token_ids]
    if not picked:
        return
    vocab_size = logits.shape[-1]
    banned = [rows[i].banned_token_ids for i in picked]
    for ids in banned:
        for t in ids:
            # An out-of-range id would be a device-side assert on CUDA; say what happened here.
            if not 0 <= t < vocab_size:
                raise ValueError(f"banned token id {t} is outside the vocabulary [0, {vocab_size})")
    local_rows, cols = _scatter_index(banned, logits.device)
    row_ids = torch.tensor(picked, dtype=torch.long, device=logits.device)[local_rows]
    logits[row_ids, cols] = float("-inf")
