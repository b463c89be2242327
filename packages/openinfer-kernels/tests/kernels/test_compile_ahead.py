"""`compile_ahead`: inside it a Triton launch compiles and launches nothing; after it the same
launch runs the variant compiled there. The worker processes compile a variant into Triton's
cache from the parts a launch computes (this runs without a GPU: Triton compiles for a named
target). `TritonCompiler` offers it to start-up through the plugin hook, torch-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from openinfer_core.interfaces.kernel_compiler import KernelCompiler
from openinfer_core.plugins import PluginManager
from openinfer_kernels import compile_ahead as ahead
from openinfer_kernels import plugin
from openinfer_kernels.compile_ahead import TritonCompiler, compile_ahead


@pytest.mark.gpu
def test_launches_inside_only_compile_and_the_variants_are_kept() -> None:
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.zeros(100, device="cuda")
    with compile_ahead(workers=4):
        for block in (128, 256):
            add_one[(1,)](x, 100, BLOCK=block)
        torch.cuda.synchronize()
        assert torch.count_nonzero(x) == 0  # nothing ran
    compiled = add_one.device_caches[torch.cuda.current_device()][0]
    assert len(compiled) == 2 and all(hasattr(k, "run") for k in compiled.values())
    add_one[(1,)](x, 100, BLOCK=128)
    add_one[(1,)](x, 100, BLOCK=256)
    torch.cuda.synchronize()
    assert torch.equal(x, torch.full_like(x, 2.0))
    assert len(compiled) == 2  # nothing compiled again


def test_without_a_gpu_it_changes_nothing() -> None:
    x = torch.zeros(3)
    with compile_ahead():
        x += 1
    assert torch.equal(x, torch.ones(3))


def test_workers_compile_a_variant_into_the_cache(tmp_path, monkeypatch) -> None:
    pytest.importorskip("triton")
    from compile_ahead_kernel import add_one
    from triton.backends.compiler import GPUTarget

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # the workers inherit these
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # they compile, as on the GPU
    ahead.start_workers(1)
    try:
        name = ahead._importable_name(add_one)
        assert name == ("compile_ahead_kernel", "add_one")
        job = ahead._workers["pool"].submit(
            ahead._compile, name, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            {(2,): 128}, {}, {}, GPUTarget("cuda", 90, 32))
        job.result(timeout=120)
    finally:
        ahead.stop_workers()
    assert [p.name for p in tmp_path.rglob("*.cubin")] == ["add_one.cubin"]


def test_a_kernel_defined_in_a_function_compiles_here() -> None:
    triton = pytest.importorskip("triton")

    @triton.jit
    def local_kernel(x_ptr):
        pass

    assert ahead._importable_name(local_kernel) is None


def test_the_plugin_registers_the_triton_compiler_for_its_sources(tmp_path, monkeypatch) -> None:
    entry = PluginManager(autoload=False, plugins=[plugin]).registries.kernel_compilers.get(
        "triton")
    assert entry.target == "openinfer_kernels.compile_ahead:TritonCompiler"
    assert entry.meta == {"sources": ("openinfer_kernels",)}
    compiler = entry.load()()
    assert isinstance(compiler, TritonCompiler) and isinstance(compiler, KernelCompiler)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert compiler.cache_dir() == tmp_path
    monkeypatch.delenv("TRITON_CACHE_DIR")
    assert compiler.cache_dir() == Path.home() / ".triton" / "cache"
    compiler.stop_workers()  # none started: nothing to do
    assert ahead._workers["pool"] is None
    x = torch.zeros(3)
    with compiler.compiling():  # `compile_ahead`: torch ops run as usual
        x += 1
    assert torch.equal(x, torch.ones(3))


def test_the_engine_process_finds_the_compiler_before_importing_torch() -> None:
    code = ("import sys\n"
            "from openinfer_core.plugins import get_plugin_manager\n"
            "from openinfer_core.startup.kernel_compilers import KernelCompilers\n"
            "compilers = KernelCompilers.from_plugins(get_plugin_manager())\n"
            "assert 'openinfer_kernels' in compilers.sources, compilers\n"
            "compilers.compiled(), compilers.fingerprint()\n"
            "leaked = [m for m in ('torch', 'triton') if m in sys.modules]\n"
            "assert not leaked, leaked\n")
    subprocess.run([sys.executable, "-c", code], check=True)
