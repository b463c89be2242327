"""The `flashinfer` attention backend: its registration and page layout on any machine; on the
GPU (`-m gpu`, with flashinfer-python installed) the same cases as the Triton kernels against
`paged_attention_ref` (`paged_cases.py`), at FlashInfer's head sizes, and at Qwen3-4B shapes."""

from __future__ import annotations

import sys

import pytest
import torch
from paged_cases import (
    DECODES,
    LARGE,
    PREFILLS,
    QWEN3_4B,
    SHORT_QUERIES,
    Req,
    check,
    check_appended,
    decodes,
    step_batch,
)

from openinfer_core.interfaces.attention import AttentionBackend
from openinfer_core.plugins import PluginManager
from openinfer_kernels import plugin
from openinfer_kernels.attention import flashinfer_backend
from openinfer_kernels.attention.flashinfer_backend import FlashInferAttentionBackend, paged_layout

gpu = pytest.mark.gpu


def test_registered_below_triton_when_flashinfer_is_installed(monkeypatch):
    real = plugin.importlib.util.find_spec
    monkeypatch.setattr(plugin.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flashinfer" else real(name, *a))
    regs = PluginManager(autoload=False, plugins=[plugin]).registries
    entry = regs.attention_backends.get("flashinfer")
    assert entry.target == (
        "openinfer_kernels.attention.flashinfer_backend:FlashInferAttentionBackend")
    assert entry.meta == {"devices": ("cuda",), "priority": 5}
    assert regs.default_attention_backend("cuda") == "triton"


def test_without_flashinfer_the_backend_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(ImportError, match=r"pip install 'openinfer-kernels\[flashinfer\]'"):
        FlashInferAttentionBackend()


def test_paged_layout_lists_each_requests_pages_in_order():
    # page 4; contexts 9 (3 pages, 1 in the last), 4 (1 full page), 1; tables padded with 0.
    _, _, _, batch = step_batch([Req(9, 1), Req(4, 4), Req(1, 1)], 2, 1, 8, torch.float32,
                                seed=0)
    batch.block_tables = torch.tensor([[7, 3, 5], [2, 0, 0], [9, 0, 0]], dtype=torch.int32,
                                      device=batch.block_tables.device)
    qo_indptr, kv_indptr, indices, last = paged_layout(batch, page=4)
    assert qo_indptr.tolist() == [0, 1, 5, 6]
    assert kv_indptr.tolist() == [0, 3, 4, 5]
    assert indices.tolist() == [7, 3, 5, 2, 9]
    assert last.tolist() == [1, 4, 1]
    assert {t.dtype for t in (qo_indptr, kv_indptr, indices, last)} == {torch.int32}
    assert {t.device.type for t in (qo_indptr, kv_indptr, indices, last)} == {"cpu"}


# --- on the GPU, with flashinfer-python ------------------------------------------------------

HEADS = pytest.mark.parametrize(("hq", "hk", "d"), [(8, 2, 64), (4, 4, 128), (32, 8, 128)],
                                ids=["gqa4-d64", "mha4-d128", "qwen3-4b"])
SMALL = {**{f"decode-{k}": v for k, v in DECODES.items()}, **PREFILLS, **SHORT_QUERIES,
         "a-request-without-queries": [Req(9, 1), Req(6, 0), Req(30, 5)]}


@pytest.fixture
def backend() -> FlashInferAttentionBackend:
    pytest.importorskip("flashinfer", reason="flashinfer-python is not installed")
    return FlashInferAttentionBackend()


def run_step(backend: FlashInferAttentionBackend, reqs: list[Req], hq: int, hk: int, d: int,
             dtype: torch.dtype, seed: int = 0) -> None:
    case, k_step, v_step, batch = step_batch(reqs, hq, hk, d, dtype, seed=seed)
    scale = d**-0.5
    out = backend.attend(case.q, k_step, v_step, case.k_cache, case.v_cache, batch, scale)
    check_appended(case)
    check(out, case, scale)


@gpu
@HEADS
@pytest.mark.parametrize("batch", list(SMALL))
def test_matches_reference(backend, batch, hq, hk, d):
    assert isinstance(backend, AttentionBackend) and backend.name == "flashinfer"
    run_step(backend, SMALL[batch], hq, hk, d, torch.bfloat16)


@gpu
@pytest.mark.parametrize("batch", list(SMALL))
def test_float16(backend, batch):  # one head shape: each dtype and shape is a JIT build
    run_step(backend, SMALL[batch], **QWEN3_4B, dtype=torch.float16)


@gpu
@pytest.mark.parametrize("batch", list(LARGE))
def test_qwen3_4b_shapes(backend, batch):
    run_step(backend, LARGE[batch], **QWEN3_4B, dtype=torch.bfloat16)


@gpu
def test_plans_once_per_step_and_again_for_the_next(backend, monkeypatch):
    plans = []
    plan = flashinfer_backend.FlashInferAttentionBackend._plan
    monkeypatch.setattr(flashinfer_backend.FlashInferAttentionBackend, "_plan",
                        lambda self, *a: (plans.append(a[2]), plan(self, *a)))
    # Two layers of one step: one batch, the same block layout, each layer's own cache.
    layer1, k1, v1, batch = step_batch(PREFILLS["mixed"], **QWEN3_4B, dtype=torch.bfloat16,
                                       seed=1)
    layer2, k2, v2, _ = step_batch(PREFILLS["mixed"], **QWEN3_4B, dtype=torch.bfloat16, seed=1)
    for t in (layer2.k_cache, layer2.v_cache, k2, v2):
        t.mul_(2)
    layer2.q.mul_(-0.5)
    for case, k, v in ((layer1, k1, v1), (layer2, k2, v2)):
        out = backend.attend(case.q, k, v, case.k_cache, case.v_cache, batch, 0.1)
        check(out, case, 0.1)
    # The next step: a decode batch of other lengths, planned anew.
    case, k, v, step2 = step_batch(decodes(5, 900, 33), **QWEN3_4B, dtype=torch.bfloat16,
                                   seed=3)
    check(backend.attend(case.q, k, v, case.k_cache, case.v_cache, step2, 0.1), case, 0.1)
    assert [id(b) for b in plans] == [id(batch), id(step2)]


@gpu
def test_float32_is_refused_with_what_to_use(backend):
    case, k, v, batch = step_batch(decodes(5), 4, 4, 128, torch.float32, seed=0)
    with pytest.raises(ValueError, match="--attention-backend triton"):
        backend.attend(case.q, k, v, case.k_cache, case.v_cache, batch, 0.1)
