"""`OPENINFER_DSV4_POST_PRE`'s plumbing in the forward (`model._around`): where the pushed
hc_post's launch also makes the next sublayer's hc_pre (`hc_post_pre_all_reduce`, a CUDA
kernel, stood in for here by the references it composes), that hc_pre is the next sublayer's
(its hc and norm), and the next sublayer takes it instead of its own: the same streams as
hc_pre, sublayer, hc_post in turn. The kernel itself: kernels/test_mhc_push_post_pre.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import openinfer_deepseek_v4.model as model
from openinfer_deepseek_v4.kernels.mhc import hc_post_ref, hc_pre_ref
from openinfer_deepseek_v4.reference import HyperConnectionWeights

N, D = 4, 8
CFG = SimpleNamespace(hc_eps=1e-6, rms_norm_eps=1e-6, hc_sinkhorn_iters=20)


def test_the_fused_post_hands_the_next_sublayer_its_pre(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(0)
    hcs = [HyperConnectionWeights(torch.randn(24, N * D, generator=g) * (N * D) ** -0.5,
                                  torch.randn(24, generator=g), 0.5 + torch.rand(3, generator=g))
           for _ in range(3)]
    norms = [1 + 0.1 * torch.randn(D, generator=g) for _ in range(3)]
    sublayers = [lambda x, k=k: torch.tanh(x * (k + 1)) for k in range(3)]
    made = []

    def post_pre(streams, out, post, comb, push, fn, base, scale, norm_weight, *, hc_eps,  # type: ignore[no-untyped-def]
                 sinkhorn_iters, norm_eps):
        new = hc_post_ref(streams, out, post, comb, hc_eps=hc_eps, sinkhorn_iters=sinkhorn_iters)
        made.append(fn)
        return (new, *hc_pre_ref(new, fn, base, scale, norm_weight, hc_eps=hc_eps,
                                 norm_eps=norm_eps))

    monkeypatch.setattr(model, "hc_post_pre_all_reduce", post_pre)
    monkeypatch.setattr(model, "hc_post_all_reduce", lambda *a, **k: None)
    tp = SimpleNamespace(all_reduce=lambda t: t)  # one rank: the sum is the partial
    start = torch.randn(1, N, D, generator=g)
    want = start
    for hc, norm, sub in zip(hcs, norms, sublayers, strict=True):
        want, none = model._around(want, hc, norm, sub, CFG)  # type: ignore[arg-type]
        assert none is None
    got, pre = start, None
    for k, (hc, norm, sub) in enumerate(zip(hcs, norms, sublayers, strict=True)):
        then = (hcs[k + 1], norms[k + 1]) if k + 1 < len(hcs) else None
        got, pre = model._around(got, hc, norm, sub, CFG, tp, object(), pre,  # type: ignore[arg-type]
                                 then)
        assert (pre is None) == (then is None)
    assert len(made) == 2 and made[0] is hcs[1].fn and made[1] is hcs[2].fn  # the next ones
    assert torch.equal(got, want)
