"""Optional capabilities are declared by protocols (`interfaces.capabilities`), checked with
the `supports_*` helpers: what each built-in model, line, backend and scheduler declares, and
that no source file probes for a declared capability with `getattr` / `hasattr`."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from window_model import WindowedHistoryModel

from openinfer_core.engine.scheduler import FcfsScheduler
from openinfer_core.interfaces.attention import supports_attend_appended
from openinfer_core.interfaces.capabilities import (
    supports_close,
    supports_compile_ahead,
    supports_cuda_graphs,
    supports_expert_parallel,
    supports_kv_group_offload,
    supports_kv_offload,
    supports_offload,
    supports_sampling_kernels,
    supports_tensor_parallel,
    supports_weight_bytes,
)
from openinfer_core.interfaces.kv import KVStepLimits
from openinfer_core.interfaces.model import LoadOptions
from openinfer_core.interfaces.sampling import (
    supports_top_k_top_p_sample,
    supports_top_p_sample,
    supports_warm_up,
)
from openinfer_core.model_config import read_model_config
from openinfer_deepseek_v4.model_line import DeepseekV4ModelLine
from openinfer_kernels.attention.backend import TorchAttentionBackend
from openinfer_kernels.attention.triton_backend import TritonAttentionBackend
from openinfer_kernels.sampling import SAMPLING_KERNELS, TritonSamplingKernels
from openinfer_kernels.sampling.flashinfer import FlashInferSamplingKernels
from openinfer_qwen3.model_line import Qwen3ModelLine
from openinfer_toy.model import ToyCounterLine, ToyCounterModel

ROOT = Path(__file__).resolve().parents[1]


def _qwen3_cpu(model_dir: Path):  # type: ignore[no-untyped-def]
    options = LoadOptions(device=torch.device("cpu"), dtype=torch.float32,
                          attention=TorchAttentionBackend())
    return Qwen3ModelLine.load(model_dir, read_model_config(model_dir), options)


def test_qwen3_model_declares_its_capabilities(qwen3_dir: Path) -> None:
    model = _qwen3_cpu(qwen3_dir)
    assert supports_sampling_kernels(model) and model.sampling_kernels is SAMPLING_KERNELS
    assert supports_weight_bytes(model) and model.weight_bytes > 0
    assert supports_kv_offload(model)
    assert supports_compile_ahead(model)
    # Declared, but the torch backend cannot be captured: the value says so.
    assert supports_cuda_graphs(model)
    assert (model.cuda_graph_safe, model.cuda_graph_max_tokens) == (False, 0)
    assert not supports_close(model)


def test_toy_model_declares_none() -> None:
    model = ToyCounterModel(8, 1, 64, torch.device("cpu"))
    for check in (supports_cuda_graphs, supports_sampling_kernels, supports_weight_bytes,
                  supports_kv_offload, supports_close,
                  supports_compile_ahead):
        assert not check(model), check.__name__


def test_model_lines() -> None:
    assert supports_tensor_parallel(Qwen3ModelLine)
    assert not supports_expert_parallel(Qwen3ModelLine)
    assert supports_tensor_parallel(DeepseekV4ModelLine)
    assert supports_expert_parallel(DeepseekV4ModelLine)
    assert not supports_tensor_parallel(ToyCounterLine)
    assert not supports_expert_parallel(ToyCounterLine)

    class FlagFalse:
        supports_tensor_parallel = False

    assert not supports_tensor_parallel(FlagFalse)


def test_attention_backends() -> None:
    torch_backend, triton_backend = TorchAttentionBackend(), TritonAttentionBackend()
    assert supports_attend_appended(torch_backend) and supports_attend_appended(triton_backend)
    assert not supports_cuda_graphs(torch_backend)
    assert supports_cuda_graphs(triton_backend) and triton_backend.cuda_graph_safe
    assert triton_backend.cuda_graph_max_tokens > 0


def test_sampling_kernels_optional_methods() -> None:
    triton_kernels = TritonSamplingKernels()
    assert supports_top_p_sample(triton_kernels) and supports_warm_up(triton_kernels)
    assert not supports_top_k_top_p_sample(triton_kernels)  # FlashInfer's draw only
    assert supports_top_k_top_p_sample(FlashInferSamplingKernels)
    assert not supports_top_p_sample(object())


def test_the_window_model_offloads_its_groups() -> None:
    model = WindowedHistoryModel(97, 3, 64, torch.device("cpu"))
    assert supports_kv_group_offload(model) and not supports_kv_group_offload(object())
    model.create_kv_cache(8, 4, KVStepLimits(2, 8))
    window, full = model.kv_group_block_tensors()
    assert [t.shape[0] for t in (*window, *full)] == list(model.pool_blocks)


def test_fcfs_scheduler_supports_offload() -> None:
    assert supports_offload(FcfsScheduler)
    assert not supports_offload(object())


# Attribute names of declared capabilities: no source may probe for them by name.
_CAPABILITY_NAMES = (
    "cuda_graph_safe", "cuda_graph_max_tokens", "sampling_kernels", "weight_bytes",
    "kv_block_tensors", "kv_group_block_tensors", "compile_ahead", "compile_ahead_safe",
    "supports_tensor_parallel",
    "supports_expert_parallel", "supports_offload", "attach_offload", "attend_appended",
    "top_p_sample", "top_k_top_p_sample", "warm_up", "launched", "close")
_PROBES = {"getattr", "hasattr", "getattr_static"}


def _probes(source: str) -> list[str]:
    """Each call of getattr / hasattr / inspect.getattr_static whose attribute is a string naming
    a declared capability, however its object is written."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        attr = node.args[1]
        if (name in _PROBES and isinstance(attr, ast.Constant)
                and attr.value in _CAPABILITY_NAMES):
            found.append(f"{name}(..., {attr.value!r}) at line {node.lineno}")
    return found


def test_the_probe_scan_finds_every_form() -> None:
    source = ("getattr(entry.load(), 'supports_expert_parallel', False)\n"
              "hasattr(model, 'kv_block_tensors')\n"
              "inspect.getattr_static(line, 'supports_tensor_parallel')\n"
              "getattr(batch, 'input_ids')\n")
    assert len(_probes(source)) == 3


def test_no_source_probes_a_declared_capability() -> None:
    sources = [*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("examples/*/src/**/*.py")]
    assert len(sources) > 100
    probes = [f"{path.relative_to(ROOT)}: {probe}" for path in sources
              for probe in _probes(path.read_text())]
    assert probes == []
