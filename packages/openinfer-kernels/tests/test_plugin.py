"""openinfer-kernels as a plugin: what it registers, that discovery stays torch-free, and the
lazy public names of the package."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

import openinfer_kernels
from openinfer_core.plugins import PluginManager
from openinfer_kernels import plugin


def test_registers_the_torch_and_triton_attention_backends(monkeypatch):
    real = plugin.importlib.util.find_spec  # as if flashinfer is not installed
    monkeypatch.setattr(plugin.importlib.util, "find_spec",
                        lambda name, *a: None if name == "flashinfer" else real(name, *a))
    regs = PluginManager(autoload=False, plugins=[plugin]).registries
    assert regs.attention_backends.names() == ["torch", "triton"]
    torch_entry = regs.attention_backends.get("torch")
    assert torch_entry.target == "openinfer_kernels.attention.backend:TorchAttentionBackend"
    assert torch_entry.meta == {"devices": ("cpu", "cuda"), "priority": 0}
    triton_entry = regs.attention_backends.get("triton")
    assert triton_entry.target == (
        "openinfer_kernels.attention.triton_backend:TritonAttentionBackend")
    assert triton_entry.meta == {"devices": ("cuda",), "priority": 10}
    assert regs.default_attention_backend("cpu") == "torch"
    assert regs.default_attention_backend("cuda") == "triton"
    assert len(regs.models) == len(regs.schedulers) == len(regs.offload_tiers) == 0

    from openinfer_kernels.attention.backend import TorchAttentionBackend
    from openinfer_kernels.attention.triton_backend import TritonAttentionBackend

    assert regs.attention_backends.resolve("torch") is TorchAttentionBackend
    assert regs.attention_backends.resolve("triton") is TritonAttentionBackend


def test_entry_point_names_the_plugin_module():
    ours = [ep for ep in entry_points(group="openinfer") if ep.name == "kernels"]
    assert [ep.value for ep in ours] == ["openinfer_kernels.plugin"]


def test_discovery_does_not_import_torch():
    code = ("import sys, openinfer_kernels, openinfer_kernels.plugin; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_triton_every_op_is_its_reference():
    code = ("import sys; sys.modules['triton'] = None; "  # makes `import triton` fail
            "import openinfer_kernels as k, openinfer_kernels.norm as n; "
            "assert n.rms_norm is n.rms_norm_ref; "
            "assert all(callable(getattr(k, name)) for name in k.__all__)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_public_names_resolve_lazily():
    for name in openinfer_kernels.__all__:
        assert callable(getattr(openinfer_kernels, name)), name
    # Again, now that every folder is imported: a folder named like its op would shadow it.
    for name in openinfer_kernels.__all__:
        assert callable(getattr(openinfer_kernels, name)), f"{name} is shadowed by a module"
    with pytest.raises(AttributeError, match="no_such_op"):
        _ = openinfer_kernels.no_such_op
