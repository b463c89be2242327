"""mHC's Triton path (hc_pre, hc_post, hc_head) against the references, which compose the
pieces exactly as the DeepSeek-V4 model's `around` and `head_logits` do."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.mhc import (
    hc_expand_ref,
    hc_head_ref,
    hc_post_ref,
    hc_pre_ref,
    hc_weights_ref,
)
from openinfer_deepseek_v4.kernels.mhc.reference import comb_ref
from openinfer_deepseek_v4.kernels.mhc.triton import hc_head_triton, hc_post_triton, hc_pre_triton

# The kernels run compiled on a GPU, else under the Triton interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N, HC_EPS, NORM_EPS, ITERS = 4, 1e-6, 1e-6, 20

# post and comb are fp32 from the same fp32 math in another order (the split-K sums, the RMS
# applied after the projection): a few fp32 ulps, the 20 Sinkhorn passes included.
WEIGHTS_TOL = dict(rtol=1e-5, atol=1e-6)
# comb's logits before the Sinkhorn: O(1) values (fn ~ 1 / sqrt(N D)) summed over N D products,
# so a few ulps of the sums move one near 0 by more than `WEIGHTS_TOL`'s 1e-6 allows it: 2.7e-6
# at hidden 4096, T = 2048, on an H200 (`gpu_check.sh dsv4gates`). Absolute: ~20 ulps of 1.
LOGITS_TOL = dict(rtol=1e-5, atol=1e-5)
# x / the head's collapse / the new streams. fp32: rounding order only. bf16: both sides round
# at the same points (collapse, normed output; each term of the expansion, their sum), but a
# term one side rounds up and the other down moves the result by one ulp of that term, which
# for the expansion's two terms (|term| < 16 here) can be 2^-4 absolute even when their sum is
# near 0; hence an absolute bound of one ulp of the largest term, and one ulp (2^-7) relative.
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2**-7, atol=2**-4)}
if DEVICE == "cpu":  # the interpreter's casts truncate: up to one more ulp per rounding point
    TOL[torch.bfloat16] = dict(rtol=2**-5, atol=2**-3)

# (T, D): T 16 and up take the kernel's tl.dot path, fewer the CUDA-core path.
CASES = {"t1-d64": (1, 64), "t3-d40": (3, 40), "t9-d48": (9, 48), "t17-d40": (17, 40)}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def make(t: int, d: int, dtype: torch.dtype, *, head: bool = False, seed: int = 0
         ) -> tuple[torch.Tensor, ...]:
    """streams [T, N, D] (the three stream scales differ, as after a few layers), fn, base,
    scale, norm weight, on DEVICE. fn's entries ~ 1 / sqrt(N D) keep the mixes O(1)."""
    g = torch.Generator().manual_seed(seed)
    m = N if head else (2 + N) * N
    streams = torch.randn(t, N, d, generator=g) * torch.tensor([1.0, 3.0, 0.5, 2.0])[:, None]
    fn = torch.randn(m, N * d, generator=g) * (N * d) ** -0.5
    base = torch.randn(m, generator=g)
    scale = 0.5 + torch.rand(1 if head else 3, generator=g)
    norm_weight = 1 + 0.5 * torch.randn(d, generator=g)
    return (streams.to(dtype).to(DEVICE), fn.to(DEVICE), base.to(DEVICE), scale.to(DEVICE),
            norm_weight.to(dtype).to(DEVICE))


def check_pre(t: int, d: int, dtype: torch.dtype) -> None:
    streams, fn, base, scale, norm_weight = make(t, d, dtype)
    args = dict(hc_eps=HC_EPS, norm_eps=NORM_EPS)
    x, post, logits = hc_pre_triton(streams, fn, base, scale, norm_weight, **args)
    x_ref, post_ref, logits_ref = hc_pre_ref(streams, fn, base, scale, norm_weight, **args)
    assert x.dtype == dtype and post.dtype == logits.dtype == torch.float32
    assert (x.shape, post.shape, logits.shape) == ((t, d), (t, N), (t, N, N))
    torch.testing.assert_close(post, post_ref, **WEIGHTS_TOL)
    torch.testing.assert_close(logits, logits_ref, **LOGITS_TOL)
    # and comb as hc_post makes it from them, after the Sinkhorn
    mixing = dict(hc_eps=HC_EPS, sinkhorn_iters=ITERS)
    torch.testing.assert_close(comb_ref(logits, **mixing), comb_ref(logits_ref, **mixing),
                               **WEIGHTS_TOL)
    torch.testing.assert_close(x, x_ref, **TOL[dtype])


@DTYPES
@pytest.mark.parametrize("case", list(CASES))
def test_hc_pre_matches_reference(case: str, dtype: torch.dtype) -> None:
    check_pre(*CASES[case], dtype)


@DTYPES
@pytest.mark.parametrize("case", list(CASES))
def test_hc_post_matches_reference(case: str, dtype: torch.dtype) -> None:
    t, d = CASES[case]
    streams, fn, base, scale, norm_weight = make(t, d, dtype)
    _, post, comb = hc_pre_ref(streams, fn, base, scale, norm_weight, hc_eps=HC_EPS,
                               norm_eps=NORM_EPS)
    # the sublayer's output as the model hands it over: a row slice of something wider
    out = (4 * torch.randn(t, d + 8, generator=torch.Generator().manual_seed(1))).to(dtype)
    out = out.to(DEVICE)[:, 3:3 + d]
    mixing = dict(hc_eps=HC_EPS, sinkhorn_iters=ITERS)
    new = hc_post_triton(streams, out, post, comb, **mixing)
    assert new.dtype == dtype and new.shape == (t, N, d) and new.is_contiguous()
    torch.testing.assert_close(new, hc_post_ref(streams, out, post, comb, **mixing), **TOL[dtype])


@DTYPES
def test_the_split_is_the_models_around(dtype: torch.dtype) -> None:
    """hc_pre_ref then hc_post_ref (comb's Sinkhorn-Knopp in the second) are, bit for bit, the
    model reference's pieces: `hc_weights_ref` (comb whole), the collapse, `hc_expand_ref`."""
    streams, fn, base, scale, norm_weight = make(3, 40, dtype, seed=7)
    out = torch.randn(3, 40, generator=torch.Generator().manual_seed(2)).to(dtype).to(DEVICE)
    _, post, logits = hc_pre_ref(streams, fn, base, scale, norm_weight, hc_eps=HC_EPS,
                                 norm_eps=NORM_EPS)
    got = hc_post_ref(streams, out, post, logits, hc_eps=HC_EPS, sinkhorn_iters=ITERS)
    _, post_whole, comb = hc_weights_ref(streams, fn, base, scale, hc_eps=HC_EPS,
                                         norm_eps=NORM_EPS, sinkhorn_iters=ITERS)
    assert torch.equal(got, hc_expand_ref(streams, out, post_whole, comb))


@DTYPES
@pytest.mark.parametrize("normed", [False, True], ids=["collapse", "collapse-norm"])
@pytest.mark.parametrize("case", ["t1-d64", "t9-d48", "t17-d40"])
def test_hc_head_matches_reference(case: str, dtype: torch.dtype, normed: bool) -> None:
    """The head's collapse, and with the model's last norm folded in (its weight given)."""
    t, d = CASES[case]
    streams, fn, base, scale, norm_weight = make(t, d, dtype, head=True)
    args: dict = dict(hc_eps=HC_EPS, norm_eps=NORM_EPS,
                      norm_weight=norm_weight if normed else None)
    got = hc_head_triton(streams, fn, base, scale, **args)
    assert got.dtype == dtype and got.shape == (t, d)
    want = hc_head_ref(streams, fn, base, scale, **args)
    torch.testing.assert_close(got, want, **TOL[dtype])
    if normed:  # the reference's fold is the model's two ops exactly
        from openinfer_deepseek_v4.reference import rms_norm

        plain = hc_head_ref(streams, fn, base, scale, hc_eps=HC_EPS, norm_eps=NORM_EPS)
        assert torch.equal(want, rms_norm(plain, norm_weight, NORM_EPS))


def test_strided_streams_and_no_tokens() -> None:
    streams, fn, base, scale, norm_weight = make(5, 40, torch.float32)
    wide = torch.zeros(5, N, 48, device=DEVICE)
    wide[:, :, :40] = streams
    args = dict(hc_eps=HC_EPS, norm_eps=NORM_EPS)
    for got, want in zip(hc_pre_triton(wide[:, :, :40], fn, base, scale, norm_weight, **args),
                         hc_pre_ref(streams, fn, base, scale, norm_weight, **args), strict=True):
        torch.testing.assert_close(got, want, **TOL[torch.float32])
    x, post, comb = hc_pre_triton(streams[:0], fn, base, scale, norm_weight, **args)
    assert (x.shape, post.shape, comb.shape) == ((0, 40), (0, N), (0, N, N))


def test_wrong_fn_shape_is_refused() -> None:
    streams, fn, base, scale, norm_weight = make(2, 40, torch.float32)
    with pytest.raises(ValueError, match="fn"):
        hc_pre_triton(streams, fn[:, :-1], base, scale, norm_weight, hc_eps=HC_EPS,
                      norm_eps=NORM_EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64, 2048])
def test_v4_flash_shapes(t: int) -> None:
    """Hidden 4096, N = 4, bf16 streams (the split-K and tl.dot paths at full size)."""
    check_pre(t, 4096, torch.bfloat16)
    streams, fn, base, scale, _ = make(t, 4096, torch.bfloat16, head=True)
    args = dict(hc_eps=HC_EPS, norm_eps=NORM_EPS)
    torch.testing.assert_close(hc_head_triton(streams, fn, base, scale, **args),
                               hc_head_ref(streams, fn, base, scale, **args),
                               **TOL[torch.bfloat16])


@DTYPES
@pytest.mark.parametrize("head", [False, True], ids=["pre", "head"])
def test_the_last_share_computes_one_tokens_weights_as_the_second_kernel_does(
        dtype, head, monkeypatch):
    """At one token the mix kernel's last program computes the weights itself (one launch):
    the same bits as the separate weights kernel, and its arrival count back to 0. Compiled on
    the GPU too, where the counting's memory ordering is real."""
    from openinfer_deepseek_v4.kernels.mhc import triton as mhc_triton
    from openinfer_kernels.split_k import split_counters

    streams, fn, base, scale, norm_weight = make(1, 64, dtype, head=head, seed=3)
    args = dict(hc_eps=HC_EPS, norm_eps=NORM_EPS)

    def run() -> tuple[torch.Tensor, ...]:
        if head:
            return (hc_head_triton(streams, fn, base, scale, **args),)
        return hc_pre_triton(streams, fn, base, scale, norm_weight, **args)

    assert mhc_triton.SERIAL_TOKENS >= 1
    serial = run()
    assert not split_counters(streams.device).any()
    monkeypatch.setattr(mhc_triton, "SERIAL_TOKENS", 0)
    # the same K shares (their sum's order), now in the two-launch form
    monkeypatch.setattr(mhc_triton, "MIX_MIN_K_BLOCKS", mhc_triton.SERIAL_MIN_K_BLOCKS)
    for got, want in zip(serial, run(), strict=True):
        assert torch.equal(got, want)
