"""The batched sampler: one step's logits in, one token per request out, with vLLM's semantics.

One call handles every row of the batch with row-wise tensor ops, in this order:

    raw logprobs (reported, never used to choose)
    -> grammar mask -> penalties -> banned ids      (on a copy of the logits)
    -> greedy rows: argmax
    -> other rows: temperature -> min_p -> top_k -> top_p -> exponential race

The exponential race picks argmax(prob / E) with E ~ Exp(1) drawn i.i.d. per token, which is an
exact draw from `prob` and needs no cumulative sums or searches. The noise is where randomness
lives: a row with `params.seed` draws it from a stream keyed by (seed, tokens generated so far),
so its text depends on nothing else in the batch; other rows draw from the sampler's own stream.

Given `SamplingKernels` that support the logits' device (openinfer-kernels' Triton kernels on
CUDA), the race, the temperature and min_p run in one kernel; only top_k / top_p rows are
filtered here first. Otherwise the torch code below is the path, and the spec: it is what runs on
CPU. The two draw different noise for the same seed, from the same distribution.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import openinfer_core.sampling.stable_topk as topk_module
from openinfer_core.interfaces.sampling import (
    SamplingKernels,
    supports_top_k_top_p_sample,
    supports_top_p_sample,
    supports_warm_up,
)
from openinfer_core.params import SamplingParams
from openinfer_core.sampling.penalties import apply_banned, apply_penalties
from openinfer_core.sampling.row_params import RowParamUpload
from openinfer_core.sampling.stable_topk import stable_topk
from openinfer_core.sampling.token_mask import TokenMask, apply_token_mask

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """What the sampler needs to know about one request for one step."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    banned_token_ids: Sequence[int] = ()  # set to -inf this step (e.g. EOS before min_tokens)


@dataclass(frozen=True, slots=True)
class SampledToken:
    """The chosen token, and logprobs of the raw model distribution when the request asked."""

    token_id: int
    logprob: float | None  # set iff params.logprobs is not None
    top_logprobs: tuple[tuple[int, float], ...]  # (id, logprob), best first, ties by lower id


def mix_seed(seed: int, step: int) -> int:
    """A 64-bit generator seed from a request seed and its output length (splitmix64 finaliser),
    so that consecutive steps and neighbouring seeds get unrelated noise streams."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


# The least top_p sent to the device: a smaller one rounds to 0 in fp32, where even the top id
# (nothing above it) would fall outside the nucleus. This one keeps the top id alone.
_TOP_P_MIN = float(torch.finfo(torch.float32).tiny)


def _top_p_column(params: Sequence[SamplingParams], device: torch.device) -> torch.Tensor:
    """[len(params), 1] fp32 top_p on `device`, at least _TOP_P_MIN."""
    return _column([max(p.top_p, _TOP_P_MIN) for p in params], device)


def _top_ks(params: Sequence[SamplingParams], vocab_size: int) -> list[int]:
    """Each row's top_k, the vocabulary where it is off."""
    return [min(p.top_k, vocab_size) if p.top_k_enabled else vocab_size for p in params]


def _row_index(rows: Sequence[int], device: torch.device) -> torch.Tensor:
    """Row indices on `device`, copied without waiting for the device."""
    return _to_device(torch.tensor(rows, dtype=torch.int64), device)


def _column(values: Sequence[float], device: torch.device,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[len(values), 1] on `device`, copied without waiting for the device (the step in
    flight)."""
    return _to_device(torch.tensor(values, dtype=dtype), device).unsqueeze(1)


# Rows whose top_k is at most this take their survivors from `stable_topk` of that many
# columns; the others (top_p alone, or a larger k) sort the whole row.
TOP_K_SELECT_MAX = 1024


def apply_top_k_top_p(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Mask (to -inf) everything outside each row's top_k, then outside its top_p nucleus of the
    renormalised survivors, in the order of a stable descending sort (ties keep the lower id).
    In batches of SELECT_MIN_ROWS rows or more, rows whose top_k is at most TOP_K_SELECT_MAX
    order only their largest columns (`stable_topk`)."""
    vocab_size = x.shape[-1]
    if not params:
        return x.clone()
    ks = _top_ks(params, vocab_size)
    selects = x.shape[0] >= topk_module.SELECT_MIN_ROWS
    small = [i for i, k in enumerate(ks) if selects and k <= TOP_K_SELECT_MAX]
    if len(small) == len(ks):
        return _top_k_top_p_selected(x, ks, params)
    if not small:
        return _top_k_top_p_sorted(x, ks, params)
    out = torch.empty_like(x)
    large = [i for i, k in enumerate(ks) if k > TOP_K_SELECT_MAX]
    for rows, fn in ((small, _top_k_top_p_selected), (large, _top_k_top_p_sorted)):
        index = _row_index(rows, x.device)
        out[index] = fn(x[index], [ks[i] for i in rows], [params[i] for i in rows])
    return out


def _top_k_top_p_sorted(x: torch.Tensor, ks: Sequence[int],
                        params: Sequence[SamplingParams]) -> torch.Tensor:
    sorted_x, order = x.sort(dim=-1, descending=True, stable=True)
    return torch.empty_like(x).scatter_(-1, order, _keep(sorted_x, ks, params))


def _top_k_top_p_selected(x: torch.Tensor, ks: Sequence[int],
                          params: Sequence[SamplingParams]) -> torch.Tensor:
    """`_top_k_top_p_sorted` from the first max(ks) sorted columns: everything past a row's k
    is dropped anyway, so the rest of the order is never needed."""
    top_x, order = stable_topk(x, max(ks))
    out = torch.full_like(x, float("-inf"))
    return out.scatter_(-1, order, _keep(top_x, ks, params))


def _keep(sorted_x: torch.Tensor, ks: Sequence[int],
          params: Sequence[SamplingParams]) -> torch.Tensor:
    """Rows sorted descending, with the columns past each row's k and outside its top_p nucleus
    set to -inf."""
    device = sorted_x.device
    k = _column(ks, device, torch.long)
    top_p = _top_p_column(params, device)
    rank = torch.arange(sorted_x.shape[-1], device=device).unsqueeze(0)
    sorted_x = sorted_x.masked_fill(rank >= k, float("-inf"))
    probs = sorted_x.softmax(dim=-1)
    # A token stays if the mass strictly above it is still short of top_p: that is the smallest
    # set reaching top_p, and the top token (nothing above it) always stays. Rows with
    # top_p == 1 are exempt so fp32 rounding in the cumsum cannot clip their tail.
    mass_above = probs.cumsum(dim=-1) - probs
    outside = (mass_above >= top_p) & (top_p < 1.0)
    return sorted_x.masked_fill(outside, float("-inf"))


def _signed64(value: int) -> int:
    """A 64-bit pattern as the int64 that holds the same bits."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


class Sampler:
    """Chooses the next token for every row of a batch.

    `sample` advances the sampler's own random streams (used by rows without a seed); it is not
    thread-safe. It never mutates the caller's logits."""

    def __init__(self, vocab_size: int, seed: int = 0,
                 kernels: SamplingKernels | None = None) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self.seed = seed
        self.kernels = kernels
        # The kernels' optional draws, looked up once (interfaces/sampling.py).
        self._top_p_kernel = kernels.top_p_sample if supports_top_p_sample(kernels) else None
        self._fused_kernel = (kernels.top_k_top_p_sample
                              if supports_top_k_top_p_sample(kernels) else None)
        # Torch path: one generator per device, made on first use (the device is not known yet).
        self._generators: dict[torch.device, torch.Generator] = {}
        # Kernel path: unseeded rows get a fresh 63-bit seed per step from this host stream.
        self._host_rng = random.Random(seed)
        self._row_params = RowParamUpload()

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow],
               token_mask: TokenMask | None = None) -> list[SampledToken]:
        """Return one `SampledToken` per row, in row order. `logits` is fp32 [len(rows), V];
        `token_mask` limits some rows to a grammar's tokens (before every other step)."""
        return self.sample_async(logits, rows, token_mask).result()

    def sample_async(self, logits: torch.Tensor, rows: Sequence[SamplingRow],
                     token_mask: TokenMask | None = None) -> SampledBatch:
        """`sample`, with the host's wait left to `SampledBatch.result()`: the token ids stay on
        the device for the next step, and their copy to the host is under way."""
        if logits.dim() != 2 or logits.shape != (len(rows), self.vocab_size):
            raise ValueError(
                f"logits shape {tuple(logits.shape)} does not match "
                f"({len(rows)} rows, vocab_size {self.vocab_size})"
            )
        edits = token_mask is not None or any(
            row.params.has_penalties or row.banned_token_ids for row in rows)
        random_rows = [i for i, row in enumerate(rows) if not row.params.is_greedy]
        if not edits and not random_rows:
            # The common decode step: no copy, one argmax (first maximum = lowest id on ties).
            return self._package(logits, logits.argmax(dim=-1), rows)

        work = logits.to(torch.float32, copy=edits)
        if token_mask is not None:
            apply_token_mask(work, token_mask)
        apply_penalties(work, rows)
        apply_banned(work, rows)
        if not random_rows:
            token_ids = work.argmax(dim=-1)
        elif self.kernels is not None and self.kernels.supports(work.device):
            token_ids = self._sample_with_kernels(work, rows, owned=work is not logits)
        else:
            token_ids = self._sample_with_torch(work, rows, random_rows)
        return self._package(logits, token_ids, rows)

    # -- kernel path -----------------------------------------------------------------------
    def _sample_with_kernels(self, work: torch.Tensor, rows: Sequence[SamplingRow],
                             owned: bool) -> torch.Tensor:
        """Every row in one `race_sample` launch; greedy rows go in with temperature 0.
        `owned`: `work` is the sampler's copy, so top_k / top_p rows may be written into it."""
        assert self.kernels is not None
        temperature: list[float] = []
        min_p: list[float] = []
        seeds: list[int] = []
        sorted_rows: list[int] = []
        nucleus_rows: list[int] = []  # top_p alone, where the kernels race within it
        fused_rows: list[int] = []  # unseeded top_k / top_p rows the kernels draw themselves
        top_p_kernel, fused_kernel = self._top_p_kernel, self._fused_kernel
        for i, row in enumerate(rows):
            p = row.params
            if p.is_greedy:
                temperature.append(0.0)
                min_p.append(0.0)
                seeds.append(0)
                continue
            seeds.append(self._row_seed(row))
            # Not a row with banned ids: with a grammar's mask they may leave nothing, where
            # the race's contract (id 0) holds and FlashInfer's does not.
            if (fused_kernel is not None and p.seed is None and p.min_p == 0.0
                    and not row.banned_token_ids and (p.top_k_enabled or p.top_p < 1.0)):
                fused_rows.append(i)  # drawn below; the launch over all rows skips it
                temperature.append(0.0)
                min_p.append(0.0)
            elif top_p_kernel is not None and p.top_p < 1.0 and not p.top_k_enabled:
                nucleus_rows.append(i)  # raced below; the launch over all rows skips it
                temperature.append(0.0)
                min_p.append(0.0)
            elif p.top_k_enabled or p.top_p < 1.0:
                # Filtered below, already divided by T: the kernel only races them.
                sorted_rows.append(i)
                temperature.append(1.0)
                min_p.append(0.0)
            else:
                temperature.append(p.temperature)
                min_p.append(p.min_p)
        t_dev, min_p_dev, seeds_dev = self._row_params.upload(temperature, min_p, seeds,
                                                              work.device)
        if len(sorted_rows) == len(rows):
            work = _filter(work, [row.params for row in rows])  # a new tensor: no gather/scatter
        elif sorted_rows:
            index = _row_index(sorted_rows, work.device)
            filtered = _filter(work[index], [rows[i].params for i in sorted_rows])
            if not owned:
                work = work.clone()
            work[index] = filtered
        has_min_p = any(m > 0.0 for m in min_p)
        if len(nucleus_rows) + len(fused_rows) == len(rows):
            token_ids = torch.empty(len(rows), dtype=torch.int64, device=work.device)
        else:
            token_ids = self.kernels.race_sample(work, t_dev, min_p_dev if has_min_p else None,
                                                 seeds_dev)
        if nucleus_rows:
            assert top_p_kernel is not None
            index = _row_index(nucleus_rows, work.device)
            params = [rows[i].params for i in nucleus_rows]
            token_ids[index] = top_p_kernel(_scale_and_min_p(work[index], params),
                                            _top_p_column(params, work.device)[:, 0],
                                            seeds_dev[index])
        if fused_rows:
            assert fused_kernel is not None
            index = _row_index(fused_rows, work.device)
            params = [rows[i].params for i in fused_rows]
            top_k = _column(_top_ks(params, work.shape[-1]), work.device, torch.int32)[:, 0]
            token_ids[index] = fused_kernel(_scale_and_min_p(work[index], params), top_k,
                                            _top_p_column(params, work.device)[:, 0],
                                            self._host_rng.getrandbits(63))
        return token_ids

    def _row_seed(self, row: SamplingRow) -> int:
        if row.params.seed is None:
            return self._host_rng.getrandbits(63)
        return _signed64(mix_seed(row.params.seed, len(row.output_token_ids)))

    # -- torch path ------------------------------------------------------------------------
    def _sample_with_torch(self, work: torch.Tensor, rows: Sequence[SamplingRow],
                           random_rows: list[int]) -> torch.Tensor:
        if len(random_rows) == len(rows):
            return self._race(work, rows)
        # torch.argmax returns the first maximum, i.e. the lowest id on ties.
        token_ids = work.argmax(dim=-1)
        token_ids[random_rows] = self._race(work[random_rows], [rows[i] for i in random_rows])
        return token_ids

    def _race(self, x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        probs = _filter(x, [row.params for row in rows]).softmax(dim=-1)
        return (probs / self._exponential_noise(rows, x.shape[-1], x.device)).argmax(dim=-1)

    def _exponential_noise(
        self, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
    ) -> torch.Tensor:
        noise = torch.empty(len(rows), vocab_size, dtype=torch.float32, device=device)
        unseeded = [i for i, row in enumerate(rows) if row.params.seed is None]
        if len(unseeded) == len(rows):
            noise.exponential_(generator=self._generator(device))
        elif unseeded:
            shared = torch.empty(len(unseeded), vocab_size, dtype=torch.float32, device=device)
            noise[unseeded] = shared.exponential_(generator=self._generator(device))
        for i, row in enumerate(rows):
            seed = row.params.seed
            if seed is not None:
                gen = torch.Generator(device=device)
                gen.manual_seed(mix_seed(seed, len(row.output_token_ids)))
                noise[i].exponential_(generator=gen)
        # A zero draw would make 0/0 = NaN for a masked token, and argmax favours NaN.
        return noise.clamp_(min=torch.finfo(torch.float32).tiny)

    def _generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed & _MASK64)
            self._generators[device] = gen
        return gen

    # -- results ---------------------------------------------------------------------------
    def _package(self, logits: torch.Tensor, token_ids: torch.Tensor,
                 rows: Sequence[SamplingRow]) -> SampledBatch:
        """Everything the host needs, packed on the device into one tensor whose copy to the
        host starts now: token ids, then (for rows that asked) logprobs and top logprobs."""
        wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
        if not wanted:
            return SampledBatch(token_ids, _to_host(token_ids), len(rows), (), 0, ())
        sub_logits, sub_ids = logits, token_ids
        if len(wanted) < len(rows):
            index = _row_index(wanted, logits.device)
            sub_logits, sub_ids = logits[index], token_ids[index]
        raw = torch.log_softmax(sub_logits.to(torch.float32), dim=-1)
        chosen = raw.gather(1, sub_ids.unsqueeze(1)).squeeze(1)
        n_max = min(max(rows[i].params.logprobs or 0 for i in wanted), self.vocab_size)
        # float64 holds the ids and fp32 values exactly.
        parts = [token_ids.double(), chosen.double()]
        if n_max > 0:
            # As a stable sort orders them: equal logprobs come out lowest id first.
            vals, order = stable_topk(raw, n_max)
            parts += [vals.double().flatten(), order.double().flatten()]
        counts = tuple(rows[i].params.logprobs or 0 for i in wanted)
        return SampledBatch(token_ids, _to_host(torch.cat(parts)), len(rows), tuple(wanted),
                            n_max, counts)


def _to_host(x: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Start copying `x` to the host: (host tensor, event to wait on before reading it)."""
    if x.device.type != "cuda":
        return x, None
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the device (pinned, then asynchronous)."""
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


@dataclass(slots=True)
class SampledBatch:
    """A step's sampled tokens: `token_ids` stays on the device (the next overlapped step
    reads it there); `result()` waits for the copy to the host and unpacks it."""

    token_ids: torch.Tensor  # [S] int64, on the logits' device
    _host: tuple[torch.Tensor, torch.cuda.Event | None]
    _num_rows: int
    _wanted: tuple[int, ...]  # rows that asked for logprobs
    _n_max: int  # top logprobs per wanted row in the packed copy
    _counts: tuple[int, ...]  # top logprobs each wanted row asked for
    _result: list[SampledToken] | None = None

    def result(self) -> list[SampledToken]:
        """One `SampledToken` per row, in row order; blocks until the step's copy lands."""
        if self._result is None:
            self._result = self._unpack()
        return self._result

    def _unpack(self) -> list[SampledToken]:
        host, event = self._host
        if event is not None:
            event.synchronize()
        values: list[float] = host.tolist()
        n, w, n_max = self._num_rows, len(self._wanted), self._n_max
        if not w:
            return [SampledToken(int(t), None, ()) for t in values]
        ids = [int(t) for t in values[:n]]
        chosen_lp = values[n:n + w]
        top_vals = values[n + w:n + w + w * n_max]
        top_ids = values[n + w + w * n_max:]
        out = [SampledToken(t, None, ()) for t in ids]
        for j, i in enumerate(self._wanted):
            first = j * n_max
            top = tuple((int(top_ids[first + r]), top_vals[first + r])
                        for r in range(min(self._counts[j], n_max)))
            out[i] = SampledToken(ids[i], chosen_lp[j], top)
        return out


def warm_up_kernels(kernels: SamplingKernels | None, device: torch.device,
                    vocab_size: int) -> None:
    """Let sampling kernels that support `device` build or load what their first use would (a
    JIT compile that could otherwise stall the first step that samples)."""
    if supports_warm_up(kernels) and kernels.supports(device):
        kernels.warm_up(device, vocab_size)


def _scale_and_min_p(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """temperature -> min_p, as a new tensor with the dropped ids at -inf."""
    device = x.device
    x = x / _column([p.temperature for p in params], device)
    if any(p.min_p > 0.0 for p in params):
        probs = x.softmax(dim=-1)
        floor = probs.amax(dim=-1, keepdim=True) * _column([p.min_p for p in params], device)
        x = x.masked_fill(probs < floor, float("-inf"))
    return x


def _filter(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """temperature -> min_p -> top_k -> top_p, as a new tensor with the dropped ids at -inf."""
    x = _scale_and_min_p(x, params)
    if any(p.top_k_enabled or p.top_p < 1.0 for p in params):
        x = apply_top_k_top_p(x, params)
    return x

