"""The rounding DeepSeek-V4 applies inside its forward (spec: shared deepseek-v4.md §10.3), in
plain torch: FP8 e4m3 and FP4 e2m1 with a power-of-two scale per block, the Walsh-Hadamard
rotation, and the in-place forms over rows of a cache pool that the model uses."""

from __future__ import annotations

from functools import lru_cache

import torch

FP8_BLOCK, FP4_BLOCK = 64, 32
FP8_MAX, FP4_MAX = 448.0, 6.0
# e2m1's magnitudes, and the midpoints between neighbours: a value on a midpoint goes to the
# neighbour with the even code (0, 1, 2, 4), as round-to-nearest-even does.
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_FP4_TIES_UP = (0.75, 1.75, 3.5)  # midpoints whose upper neighbour has the even code


def _pow2_scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """2^ceil(log2(amax / top)) in fp32 (amax / top taken as fp32 times fp32(1 / top))."""
    ratio = amax * torch.tensor(1.0 / top, dtype=torch.float32, device=amax.device)
    mantissa, exponent = torch.frexp(ratio)  # ratio = mantissa * 2^exponent, mantissa in [.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent).clamp(min=-126)
    return torch.ldexp(torch.ones_like(ratio), exponent)


def fp8_round(x: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """x (last dim a multiple of `block`) rounded to e4m3 with a power-of-two scale per block,
    in x's dtype."""
    blocks = x.float().unflatten(-1, (-1, block))
    scale = _pow2_scale(blocks.abs().amax(-1, keepdim=True).clamp(min=1e-4), FP8_MAX)
    codes = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (codes.float() * scale).flatten(-2).to(x.dtype)


def fp8_round_nope(x: torch.Tensor, rope_dims: int) -> torch.Tensor:
    """Raw and main compressed entries [..., D]: the first D - rope_dims dims rounded
    (`fp8_round`), the rotary dims kept."""
    nope = x.shape[-1] - rope_dims
    return torch.cat([fp8_round(x[..., :nope]), x[..., nope:]], dim=-1)


def fp4_round(x: torch.Tensor, block: int = FP4_BLOCK) -> torch.Tensor:
    """x (last dim a multiple of `block`) rounded to e2m1 with a power-of-two scale per block,
    in x's dtype."""
    blocks = x.float().unflatten(-1, (-1, block))
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=FP4_MAX * 2.0 ** -126)
    scale = _pow2_scale(amax, FP4_MAX)
    scaled = (blocks / scale).clamp(-FP4_MAX, FP4_MAX)
    magnitude = scaled.abs()
    table = _fp4_tables(x.device)
    code = torch.bucketize(magnitude, table[1])  # a midpoint itself goes to the lower value
    code = code + torch.isin(magnitude, table[2]).long()  # ... but these go up
    rounded = table[0][code].copysign(scaled)
    return (rounded * scale).flatten(-2).to(x.dtype)


@lru_cache(maxsize=8)
def _fp4_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.tensor(_FP4_VALUES, device=device), torch.tensor(_FP4_MIDPOINTS, device=device),
            torch.tensor(_FP4_TIES_UP, device=device))


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] (n a power of two) times the n x n Walsh-Hadamard matrix in Sylvester order,
    over sqrt(n): an orthonormal rotation (symmetric, its own inverse)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two width, got {n}")
    return (x.float() @ hadamard_matrix(n, x.device)).to(x.dtype)


@lru_cache(maxsize=8)
def hadamard_matrix(n: int, device: torch.device) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return (h / n ** 0.5).to(torch.float32).to(device)


def fp8_round_rows_ref(pool: torch.Tensor, rows: torch.Tensor, rope_dims: int) -> None:
    """In place: pool rows `rows` ([N] int, repeats allowed, a negative row skipped)
    `fp8_round_nope`-ed."""
    rows = rows[rows >= 0].long()
    pool[rows] = fp8_round_nope(pool[rows], rope_dims)


def indexer_round_ref(x: torch.Tensor) -> torch.Tensor:
    """The indexer's queries or compressed keys [..., d]: rotated (`hadamard`), then rounded
    (`fp4_round`); a new tensor."""
    return fp4_round(hadamard(x))


def indexer_round_rows_ref(pool: torch.Tensor, rows: torch.Tensor) -> None:
    """In place: pool rows `rows` ([N] int, repeats allowed, a negative row skipped)
    `indexer_round`-ed."""
    rows = rows[rows >= 0].long()
    pool[rows] = indexer_round_ref(pool[rows])
