"""The FP8 (e4m3) KV cache: quantize on write (`kv_append`, `qk_norm_rope_append`), read with
per-tensor or per-head scales (the paged attention kernels and backends), each kernel against
its plain-torch reference, which is itself checked against e4m3's rounding bounds. On CPU the
kernels run under the Triton interpreter at small sizes; `-m gpu` runs them compiled at
Qwen3-8B's shapes."""

from __future__ import annotations

import pytest
import torch
from paged_cases import DECODES, PREFILLS, SHORT_QUERIES, TOL, Case, Req, build, step_batch

from openinfer_core.interfaces.attention import KVScales
from openinfer_kernels.attention import paged_attention_ref
from openinfer_kernels.attention.backend import TorchAttentionBackend
from openinfer_kernels.attention.prefill import paged_prefill
from openinfer_kernels.attention.split import paged_decode, paged_split
from openinfer_kernels.attention.triton import paged_attention_triton
from openinfer_kernels.attention.triton_backend import TritonAttentionBackend
from openinfer_kernels.kv_store import (
    FP8_KV_DTYPE,
    FP8_MAX,
    dequantize_kv,
    kv_append_ref,
    quantize_kv,
)
from openinfer_kernels.kv_store.triton import fp8_scale_tensors, kv_append_triton
from openinfer_kernels.rotary import qk_norm_rope_append_ref, rope_cos_sin
from openinfer_kernels.rotary.triton import qk_norm_rope_append_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (k_scale, v_scale): vLLM's default 1.0; powers of two; calibrated-looking odd values; one per
# KV head (compressed-tensors' attn_head), cycled over the heads, far apart so that a head
# read with another's scale is off by far more than e4m3's rounding.
SCALES: dict[str, tuple[list[float], list[float]]] = {
    "unit": ([1.0], [1.0]), "pow2": ([0.25], [4.0]), "odd": ([0.0371], [1.7]),
    "per-head": ([0.0371, 0.9, 0.25, 3.3], [1.7, 0.125, 0.6, 5.0]),
}
# e4m3 keeps 3 mantissa bits: rounding to nearest moves a normal value (|x| >= 2^-6) by at most
# half a step, 2^-4 of it; below that (subnormals, steps of 2^-9) by at most 2^-10.
E4M3_REL, E4M3_ABS = 2**-4, 2**-10


def scales(name: str, hk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SCALES[name] as the kernels take them: fp32 [hk] each on DEVICE (a per-tensor scale
    repeated)."""
    return tuple(torch.tensor([values[h % len(values)] for h in range(hk)], device=DEVICE)
                 for values in SCALES[name])  # type: ignore[return-value]


def per_head(scale: torch.Tensor) -> torch.Tensor:
    """[Hk] scales shaped to multiply [..., Hk, D]."""
    return scale[:, None]


def e4m3_values() -> torch.Tensor:
    """Every finite e4m3 value, as fp32."""
    every = torch.arange(256, dtype=torch.uint8).view(FP8_KV_DTYPE).float()
    return every[torch.isfinite(every)]


# --- the reference's quantization ---------------------------------------------------------------

@pytest.mark.parametrize("scale", [1.0, 0.125, 8.0])
def test_e4m3_values_times_a_power_of_two_round_trip_exactly(scale):
    x = e4m3_values() * scale
    q = quantize_kv(x, FP8_KV_DTYPE, scale)
    assert q.dtype == FP8_KV_DTYPE
    assert torch.equal(dequantize_kv(q, scale), x)


@pytest.mark.parametrize("scale", [1.0, 0.0371, 3.3])
def test_rounding_error_within_half_an_e4m3_step(scale):
    x = torch.randn(20000, generator=torch.Generator().manual_seed(0)) * 50 * scale
    x = x[x.abs() <= FP8_MAX * scale]
    err = (dequantize_kv(quantize_kv(x, FP8_KV_DTYPE, scale), scale) - x).abs()
    bound = torch.maximum(E4M3_REL * x.abs(), torch.full_like(x, E4M3_ABS * scale))
    assert (err <= bound * (1 + 1e-6)).all()
    assert err.max() > 0.5 * E4M3_REL * x.abs().max() / 8  # it did round: not a no-op


def test_values_past_448_saturate():
    x = torch.tensor([1e6, -1e6, 449.0, -500.0, 448.0, float("inf")])
    got = dequantize_kv(quantize_kv(x, FP8_KV_DTYPE, 1.0), 1.0)
    assert got.tolist() == [448.0, -448.0, 448.0, -448.0, 448.0, 448.0]
    assert dequantize_kv(quantize_kv(x, FP8_KV_DTYPE, 2.0), 2.0)[0] == 896.0


def test_caches_in_the_models_dtype_ignore_the_scales():
    x = torch.randn(64)
    assert torch.equal(quantize_kv(x, torch.float32, 0.5), x)
    assert torch.equal(dequantize_kv(x, 0.5), x)


def test_a_per_head_scale_quantizes_each_head_as_its_own_number():
    # One scale per head ([Hk] over x's [..., Hk, D]) is head h quantized with scale h alone;
    # a number is that number for every head. Both sides round the inverse to fp32 once.
    x = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(1)) * 40
    k_scale = torch.tensor([0.0371, 1.0, 3.3])
    q = quantize_kv(x, FP8_KV_DTYPE, k_scale)
    for h, value in enumerate(k_scale.tolist()):
        alone = quantize_kv(x[:, h], FP8_KV_DTYPE, value)
        assert torch.equal(q[:, h].view(torch.uint8), alone.view(torch.uint8))
        assert torch.equal(dequantize_kv(q, k_scale)[:, h], dequantize_kv(alone, value))
    repeated = quantize_kv(x, FP8_KV_DTYPE, torch.full((3,), 0.0371))
    assert torch.equal(repeated.view(torch.uint8),
                       quantize_kv(x, FP8_KV_DTYPE, 0.0371).view(torch.uint8))


# --- kv_append: kernel against reference, bit for bit ------------------------------------------

SLOTS = {"decode": [22], "scattered": [36, 3, 17, 0, 79, 41, 42, 43],
         "padded": [-1, 9, -1, 70]}


@pytest.mark.parametrize("scale_name", list(SCALES))
@pytest.mark.parametrize("step_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(SLOTS))
def test_kv_append_triton_matches_reference(case, step_dtype, scale_name):
    slots = torch.tensor(SLOTS[case], device=DEVICE)
    g = torch.Generator().manual_seed(len(case))
    t, hk, d = len(SLOTS[case]), 3, 24
    k_scale, v_scale = scales(scale_name, hk)
    qkv = (torch.randn(t, 3 * hk * d, generator=g) * 300).to(step_dtype).to(DEVICE)
    k, v = qkv[:, hk * d:2 * hk * d].view(t, hk, d), qkv[:, 2 * hk * d:].view(t, hk, d)
    shape = (20, 4, hk, d)
    got = [torch.randn(shape, generator=g).to(FP8_KV_DTYPE).to(DEVICE) for _ in range(2)]
    want = [c.clone() for c in got]

    kv_append_triton(k, v, *got, slots, k_scale=k_scale, v_scale=v_scale)
    kv_append_ref(k, v, *want, slots, k_scale=k_scale, v_scale=v_scale)

    for g_cache, w_cache in zip(got, want, strict=True):
        assert torch.equal(g_cache.view(torch.uint8), w_cache.view(torch.uint8))
    # Each head holds its keys over its own scale: within half an e4m3 step of them once read
    # back times that scale (the saturation bound times it too).
    written = slots[slots >= 0]
    stored = dequantize_kv(want[0].view(-1, hk, d)[written], k_scale)
    limit = FP8_MAX * per_head(k_scale)
    expect = k[(slots >= 0).nonzero().flatten()].float().clamp(-limit, limit)
    bound = E4M3_REL * expect.abs() + E4M3_ABS * per_head(k_scale)
    assert ((stored - expect).abs() <= bound * (1 + 1e-6)).all()


def test_kv_append_reads_each_heads_scale():
    # The same keys under scales (1, 2) per head: head 0 stores them as with 1.0, head 1 as
    # with 2.0, so a kernel that read one scale for all heads fails one of the two.
    k = (torch.randn(4, 2, 16, generator=torch.Generator().manual_seed(5)) * 30).to(DEVICE)
    slots = torch.tensor([3, 0, 7, 5], device=DEVICE)
    caches = [torch.zeros(2, 4, 2, 16, dtype=FP8_KV_DTYPE, device=DEVICE) for _ in range(2)]
    two = torch.tensor([1.0, 2.0], device=DEVICE)
    kv_append_triton(k, k, *caches, slots, k_scale=two, v_scale=two.flip(0))
    stored_k = caches[0].view(-1, 2, 16)[slots]
    stored_v = caches[1].view(-1, 2, 16)[slots]
    for h, (k_value, v_value) in enumerate([(1.0, 2.0), (2.0, 1.0)]):
        assert torch.equal(stored_k[:, h].view(torch.uint8),
                           quantize_kv(k[:, h], FP8_KV_DTYPE, k_value).view(torch.uint8))
        assert torch.equal(stored_v[:, h].view(torch.uint8),
                           quantize_kv(k[:, h], FP8_KV_DTYPE, v_value).view(torch.uint8))


@pytest.mark.parametrize(("scale", "message"), [
    (torch.ones(3), r"\[2\]"), (torch.ones(2, dtype=torch.float64), "fp32"),
    (torch.ones(2, 1), r"\[2\]"),
])
def test_kernels_refuse_scales_that_are_not_fp32_one_per_head(scale, message):
    cache = torch.zeros(2, 4, 2, 16, dtype=FP8_KV_DTYPE, device=DEVICE)
    with pytest.raises(ValueError, match=message):
        fp8_scale_tensors(cache, scale.to(DEVICE), None)
    # Caches in the model's dtype read no scale: whatever is passed is not looked at.
    plain = torch.zeros(2, 4, 2, 16, device=DEVICE)
    assert fp8_scale_tensors(plain, scale.to(DEVICE), None) == (plain, plain)


@pytest.mark.parametrize("heads", [None, 2], ids=["head-a-program", "2-heads-a-program"])
@pytest.mark.parametrize("scale_name", ["unit", "odd", "per-head"])
def test_qk_norm_rope_append_quantizes_as_the_reference(scale_name, heads):
    g = torch.Generator().manual_seed(3)
    t, hq, hk, d, max_pos = 9, 6, 3, 32, 64
    k_scale, v_scale = scales(scale_name, hk)
    q, k = torch.randn(t, hq, d, generator=g), torch.randn(t, hk, d, generator=g)
    v = torch.randn(t, hk, d, generator=g) * 3
    q_w, k_w = 1 + 0.5 * torch.randn(d, generator=g), 1 + 0.5 * torch.randn(d, generator=g)
    positions = torch.randint(0, max_pos, (t,), generator=g)
    cos_sin = rope_cos_sin(max_pos, d, 1e6)
    slots = torch.randperm(24, generator=g)[:t]
    slots[::4] = -1
    args = [a.to(DEVICE) for a in (q, k, v, q_w, k_w)]
    rest = [a.to(DEVICE) for a in (positions, cos_sin)]
    caches = [torch.zeros(6, 4, hk, d, dtype=FP8_KV_DTYPE, device=DEVICE) for _ in range(4)]
    scale_args = dict(k_scale=k_scale, v_scale=v_scale)
    # 2 heads a program over 3 KV heads: the second k tile has a padding head.
    got_q = qk_norm_rope_append_triton(*args, 1e-6, *rest, caches[0], caches[1],
                                       slots.to(DEVICE), heads=heads, **scale_args)
    want_q = qk_norm_rope_append_ref(*args, 1e-6, *rest, caches[2], caches[3],
                                     slots.to(DEVICE), **scale_args)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    assert_same_bytes(caches[1], caches[3], v.to(DEVICE) / per_head(v_scale))  # v: exact
    # k: the fp32 math of kernel and reference may differ in the last bit, which can move a
    # value sitting on a rounding boundary to the next e4m3 step; anything more is a bug.
    got_k, want_k = dequantize_kv(caches[0], k_scale), dequantize_kv(caches[2], k_scale)
    bound = 2 * E4M3_REL * want_k.abs() + 2 * E4M3_ABS * per_head(k_scale)
    assert ((got_k - want_k).abs() <= bound).all()
    assert (caches[0].view(torch.uint8) == caches[2].view(torch.uint8)).float().mean() > 0.98
    assert (caches[2].view(torch.uint8) != 0).any()  # something was written


# --- reading e4m3 pages: the attention kernels against the reference ----------------------------

def assert_same_bytes(got: torch.Tensor, want: torch.Tensor, values: torch.Tensor) -> None:
    """Two e4m3 caches byte for byte; on a difference, the first few differing bytes with the
    values whose quantization the stores hold (`values`, [T, Hk, D] scaled, in token order:
    named by value, since the cache holds them at their slots)."""
    differ = got.view(torch.uint8) != want.view(torch.uint8)
    if differ.any():
        where = differ.nonzero()[:6].tolist()
        rows = [(w, hex(got.view(torch.uint8)[tuple(w)].item()),
                 hex(want.view(torch.uint8)[tuple(w)].item())) for w in where]
        near = [values.flatten()[(values.flatten() - float(want[tuple(w)].float())).abs()
                                 .argmin()].item() for w in where]
        raise AssertionError(f"{int(differ.sum())} of {differ.numel()} bytes differ: (index, "
                             f"kernel, reference) {rows}; the nearest scaled inputs {near}")


def fp8_case(reqs: list[Req], hq: int, hk: int, d: int, dtype: torch.dtype, scale_name: str,
             seed: int = 0) -> tuple[Case, torch.Tensor, torch.Tensor]:
    """`paged_cases.build`'s batch with its caches quantized to e4m3 with the scales
    `scale_name` (NaN stays NaN, so a stray read still poisons the output); keys spread wider
    than the bf16 ones, each head's values around its own scale."""
    k_scale, v_scale = scales(scale_name, hk)
    case = build(reqs, hq, hk, d, dtype, seed=seed)
    case.k_cache = quantize_kv(case.k_cache * 20 * per_head(k_scale), FP8_KV_DTYPE, k_scale)
    case.v_cache = quantize_kv(case.v_cache * 5 * per_head(v_scale), FP8_KV_DTYPE, v_scale)
    return case, k_scale, v_scale


def check_fp8(out: torch.Tensor, case: Case, scale: float, k_scale: torch.Tensor,
              v_scale: torch.Tensor) -> None:
    """Against the reference on the same e4m3 pages: both dequantize exactly (e4m3 -> fp32 or
    bf16 is exact), so the bf16/fp32 kernel tolerances apply, relative to the values' size
    (query head h's outputs are about 5 times its KV head's v scale)."""
    assert out.dtype == case.q.dtype and torch.isfinite(out).all()
    want = paged_attention_ref(*case.args(scale), k_scale=k_scale, v_scale=v_scale)
    size = 5 * per_head(v_scale.repeat_interleave(case.q.shape[1] // v_scale.shape[0]))
    torch.testing.assert_close(out / size, want / size, **TOL[case.q.dtype])


SMALL = {**{f"decode-{k}": v for k, v in DECODES.items()}, **PREFILLS, **SHORT_QUERIES}


@pytest.mark.parametrize(("dtype", "scale_name"), [
    (torch.float32, "odd"), (torch.bfloat16, "unit"), (torch.float32, "per-head"),
], ids=["fp32-odd-scales", "bf16-unit-scales", "fp32-per-head-scales"])
@pytest.mark.parametrize("batch", list(SMALL))
def test_attention_triton_reads_e4m3_pages(batch, dtype, scale_name):
    case, k_scale, v_scale = fp8_case(SMALL[batch], 4, 2, 24, dtype, scale_name)
    scale = 24**-0.5
    out = paged_attention_triton(*case.args(scale), max_query_len=case.max_query_len,
                                 k_scale=k_scale, v_scale=v_scale)
    check_fp8(out, case, scale, k_scale, v_scale)


@pytest.mark.parametrize("scale_name", ["pow2", "per-head"])
@pytest.mark.parametrize("kernel", ["decode", "split", "prefill"])
def test_each_kernel_reads_e4m3_pages(kernel, scale_name):
    # 4 KV heads of 3 query heads each: the per-head scales differ in every group.
    reqs = DECODES["b7-mixed-lengths"] if kernel == "decode" else PREFILLS["prompts-17-1-40"]
    case, k_scale, v_scale = fp8_case(reqs, 12, 4, 32, torch.bfloat16, scale_name, seed=1)
    scale = 0.2
    if kernel == "decode":
        out = paged_decode(*case.args(scale), k_scale=k_scale, v_scale=v_scale)
    elif kernel == "split":
        out = paged_split(*case.args(scale), case.max_query_len, k_scale=k_scale,
                          v_scale=v_scale)
    else:
        out = paged_prefill(*case.args(scale), case.max_query_len, k_scale=k_scale,
                            v_scale=v_scale)
    check_fp8(out, case, scale, k_scale, v_scale)


@pytest.mark.parametrize("kernel", ["split", "prefill"])
def test_scales_are_applied_per_kv_head_not_ignored(kernel):
    # The same e4m3 pages read with other scales give another answer: a KV head's v scale
    # multiplies exactly its query heads' outputs, its k scale sharpens only their softmax.
    case, _, _ = fp8_case(PREFILLS["prompts-17-1-40"], 4, 2, 24, torch.float32, "unit")
    args = case.args(0.2)
    launch = paged_split if kernel == "split" else paged_prefill

    def attend(k: list[float], v: list[float]) -> torch.Tensor:
        return launch(*args, case.max_query_len, k_scale=torch.tensor(k, device=DEVICE),
                      v_scale=torch.tensor(v, device=DEVICE))

    base = attend([1.0, 1.0], [1.0, 1.0])
    doubled_v = attend([1.0, 1.0], [1.0, 2.0])  # KV head 1: query heads 2 and 3
    torch.testing.assert_close(doubled_v[:, :2], base[:, :2], rtol=0, atol=0)
    torch.testing.assert_close(doubled_v[:, 2:], 2 * base[:, 2:], rtol=1e-6, atol=1e-6)
    sharper = attend([3.0, 1.0], [1.0, 1.0])
    assert (sharper[:, :2] - base[:, :2]).abs().max() > 0.1
    torch.testing.assert_close(sharper[:, 2:], base[:, 2:], rtol=0, atol=0)


@pytest.mark.parametrize("scale_name", ["odd", "per-head"])
@pytest.mark.parametrize("backend_cls", [TorchAttentionBackend, TritonAttentionBackend],
                         ids=["torch", "triton"])
def test_backends_append_and_attend_in_e4m3(backend_cls, scale_name):
    reqs = [Req(30, 5), Req(9, 1), Req(17, 17)]
    case, k_step, v_step, batch = step_batch(reqs, 4, 2, 32, torch.bfloat16, seed=2)
    kv_scales = KVScales.of(*(s.cpu() for s in scales(scale_name, 2))).to(DEVICE)
    k_scale, v_scale = kv_scales.k, kv_scales.v
    assert (kv_scales.per_tensor is None) == (scale_name == "per-head")
    k_step, v_step = k_step * per_head(k_scale) * 20, v_step * per_head(v_scale) * 5
    case.k_cache = quantize_kv(case.k_cache * per_head(k_scale) * 20, FP8_KV_DTYPE, k_scale)
    case.v_cache = quantize_kv(case.v_cache * per_head(v_scale) * 5, FP8_KV_DTYPE, v_scale)
    scale = 32**-0.5
    out = backend_cls().attend(case.q, k_step, v_step, case.k_cache, case.v_cache, batch, scale,
                               kv_scales=kv_scales)
    stored = case.k_cache.view(-1, 2, 32)[batch.slot_mapping]
    assert torch.equal(stored.view(torch.uint8),
                       quantize_kv(k_step, FP8_KV_DTYPE, k_scale).view(torch.uint8))
    check_fp8(out, case, scale, k_scale, v_scale)


# --- compiled, at Qwen3-8B's shapes ------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("scale_name", ["odd", "per-head"])
@pytest.mark.parametrize("batch", ["decode-64x1000", "prompt-2048", "mixed"])
def test_full_size_on_the_gpu(batch, scale_name):
    reqs = {"decode-64x1000": [Req(1000 + i, 1) for i in range(64)],
            "prompt-2048": [Req(2048, 2048)],
            "mixed": [Req(3000, 600)] + [Req(500 + i, 1) for i in range(100)]}[batch]
    case, k_scale, v_scale = fp8_case(reqs, 32, 8, 128, torch.bfloat16, scale_name)
    out = paged_attention_triton(*case.args(128**-0.5), max_query_len=case.max_query_len,
                                 k_scale=k_scale, v_scale=v_scale)
    check_fp8(out, case, 128**-0.5, k_scale, v_scale)
