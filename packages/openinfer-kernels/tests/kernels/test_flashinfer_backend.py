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

from openinfer_core.interfaces.attention import AttentionBackend, KVScales
from openinfer_core.plugins import PluginManager
from openinfer_kernels import plugin
from openinfer_kernels.attention import flashinfer_backend
from openinfer_kernels.attention.flashinfer_backend import (
    GRAPH_TOKENS,
    FlashInferAttentionBackend,
    paged_layout,
)

gpu = pytest.mark.gpu


def test_the_default_on_cuda_when_flashinfer_is_installed(monkeypatch):
    real = plugin.importlib.util.find_spec
    monkeypatch.setattr(plugin.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "flashinfer" else real(name, *a))
    regs = PluginManager(autoload=False, plugins=[plugin]).registries
    entry = regs.attention_backends.get("flashinfer")
    assert entry.target == (
        "openinfer_kernels.attention.flashinfer_backend:FlashInferAttentionBackend")
    assert entry.meta == {"devices": ("cuda",), "priority": 20}
    assert regs.default_attention_backend("cuda") == "flashinfer"
    assert regs.default_attention_backend("cpu") == "torch"


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
    want = ([0, 1, 5, 6], [0, 3, 4, 5], [7, 3, 5, 2, 9], [1, 4, 1], [9, 4, 1])
    layout = paged_layout(batch, page=4)
    assert tuple(t.tolist() for t in layout) == want
    assert {t.dtype for t in layout} == {torch.int32}
    assert {t.device.type for t in layout} == {"cpu"}
    # With the engine's host copies, those are read and the device tensors are not.
    batch.query_start_loc_cpu = batch.query_start_loc.cpu().clone()
    batch.seq_lens_cpu = batch.seq_lens.cpu().clone()
    batch.block_tables_cpu = batch.block_tables.cpu().clone()
    for t in (batch.query_start_loc, batch.seq_lens, batch.block_tables):
        t.fill_(-1)
    assert tuple(t.tolist() for t in paged_layout(batch, page=4)) == want


def test_flashinfer_runs_the_long_steps_and_triton_the_graphed_ones(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", type(sys)("flashinfer"))  # a stand-in
    hybrid, every = FlashInferAttentionBackend(), FlashInferAttentionBackend(every_step=True)
    assert hybrid.cuda_graph_safe and hybrid.cuda_graph_max_tokens == GRAPH_TOKENS
    assert not every.cuda_graph_safe and every.cuda_graph_max_tokens == 0

    def step(*reqs: Req, dtype: torch.dtype = torch.bfloat16, d: int = 64) -> tuple:
        case, _, _, batch = step_batch(list(reqs), 2, 1, d, dtype, seed=0)
        return case.q, case.k_cache, batch

    prompt_over = step(Req(GRAPH_TOKENS + 1, GRAPH_TOKENS + 1))
    prompt_at = step(Req(GRAPH_TOKENS, GRAPH_TOKENS))
    mixed_over = step(Req(900, 400), *[Req(40, 1)] * (GRAPH_TOKENS - 399))
    decodes_over = step(*[Req(20, 1)] * (GRAPH_TOKENS + 1))
    assert hybrid.runs_flashinfer(*prompt_over) and hybrid.runs_flashinfer(*mixed_over)
    assert not hybrid.runs_flashinfer(*prompt_at)
    assert not hybrid.runs_flashinfer(*decodes_over)  # decode steps stay on CUDA graphs
    # What FlashInfer has no kernels for runs the Triton ones: fp32, other head sizes.
    assert not hybrid.runs_flashinfer(*step(Req(600, 600), dtype=torch.float32))
    assert not hybrid.runs_flashinfer(*step(Req(600, 600), d=96))
    assert all(every.runs_flashinfer(*s) for s in (prompt_at, decodes_over))
    monkeypatch.setenv("OPENINFER_FLASHINFER_EVERY_STEP", "1")
    assert FlashInferAttentionBackend().every_step


def test_per_head_fp8_scales_run_the_triton_kernels(monkeypatch):
    # FlashInfer's paged kernels take one k_scale and one v_scale: an e4m3 cache whose KV heads
    # have scales of their own runs every step on the Triton kernels (which read a scale per
    # head), and a backend told to run every step on FlashInfer refuses it, saying what to do.
    monkeypatch.setitem(sys.modules, "flashinfer", type(sys)("flashinfer"))  # a stand-in
    hybrid, every = FlashInferAttentionBackend(), FlashInferAttentionBackend(every_step=True)
    case, _, _, batch = step_batch([Req(GRAPH_TOKENS + 1, GRAPH_TOKENS + 1)], 4, 2, 64,
                                   torch.bfloat16, seed=0)
    k_cache = torch.empty(1, 16, 2, 64, dtype=torch.float8_e4m3fn)
    per_tensor = KVScales.of(torch.tensor([0.5, 0.5]), torch.tensor([2.0, 2.0]))
    per_head = KVScales.of(torch.tensor([0.5, 0.25]), torch.tensor([2.0, 2.0]))
    assert hybrid.runs_flashinfer(case.q, k_cache, batch, per_tensor)
    assert hybrid.runs_flashinfer(case.q, k_cache, batch)  # no scales: 1.0 for every head
    assert not hybrid.runs_flashinfer(case.q, k_cache, batch, per_head)
    # bf16 pages read no scales: whatever is passed does not matter.
    assert hybrid.runs_flashinfer(case.q, case.k_cache, batch, per_head)
    calls = []
    monkeypatch.setattr(hybrid._triton, "attend_appended",
                        lambda *args, **kwargs: calls.append(kwargs) or args[0])
    hybrid.attend_appended(case.q, k_cache, k_cache, batch, 0.1, kv_scales=per_head)
    assert calls == [{"kv_scales": per_head}]
    with pytest.raises(ValueError, match=r"one k_scale and one v_scale per layer.*scale per KV "
                                         r"head.*--attention-backend triton"):
        every.attend_appended(case.q, k_cache, k_cache, batch, 0.1, kv_scales=per_head)


# --- on the GPU, with flashinfer-python ------------------------------------------------------

HEADS = pytest.mark.parametrize(("hq", "hk", "d"), [(8, 2, 64), (4, 4, 128), (32, 8, 128)],
                                ids=["gqa4-d64", "mha4-d128", "qwen3-4b"])
SMALL = {**{f"decode-{k}": v for k, v in DECODES.items()}, **PREFILLS, **SHORT_QUERIES,
         "a-request-without-queries": [Req(9, 1), Req(6, 0), Req(30, 5)]}


@pytest.fixture
def backend() -> FlashInferAttentionBackend:
    """FlashInfer on every step, so the kernel cases all run its kernels."""
    pytest.importorskip("flashinfer", reason="flashinfer-python is not installed")
    return FlashInferAttentionBackend(every_step=True)


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
@pytest.mark.parametrize("batch", list(LARGE))
def test_default_split_of_steps_at_qwen3_4b_shapes(batch):
    pytest.importorskip("flashinfer", reason="flashinfer-python is not installed")
    run_step(FlashInferAttentionBackend(), LARGE[batch], **QWEN3_4B, dtype=torch.bfloat16)


@gpu
def test_float32_is_refused_with_what_to_use(backend):
    case, k, v, batch = step_batch(decodes(5), 4, 4, 128, torch.float32, seed=0)
    with pytest.raises(ValueError, match="unset OPENINFER_FLASHINFER_EVERY_STEP"):
        backend.attend(case.q, k, v, case.k_cache, case.v_cache, batch, 0.1)
