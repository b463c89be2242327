"""The front-end check of every Triton kernel on CPU: the kernel tests of the packages with
Triton kernels run again in a subprocess with the interpreter off and the TTIR plugin
(`openinfer_kernels.testing.ttir_plugin`), so that every launch they make is compiled to TTIR
for sm90 instead of run. Then no launch may have failed to compile, and every @triton.jit
function those packages define must have been compiled, launched or called from one that was:
a kernel that no CPU test launches, or a launch path that stops compiling, fails here.

The subprocess's own test results are ignored, on purpose: no kernel ran, so the tests that
compare a kernel's output with its reference fail there. About a minute on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from openinfer_kernels.testing.jit_sources import jit_functions

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[3]
PLUGIN = "openinfer_kernels.testing.ttir_plugin"

# (source folder, kernel tests) of every package with Triton kernels of its own. Qwen3.5's
# prompt path runs flash-linear-attention's kernels, which are not ours to check; its decode
# kernels and gated norm are.
PACKAGES = {
    "openinfer-kernels": ("src", "tests/kernels"),
    "openinfer-deepseek-v4": ("src", "tests/kernels"),
    "openinfer-offload": ("src", "tests/test_block_copy.py"),
    "openinfer-qwen35": ("src", "tests/test_kernels.py"),
}


def run_ttir_session(tests: list[str], report: Path, cwd: Path) -> dict[str, Any]:
    """The plugin's report for a pytest session over `tests` with every launch compiled to
    TTIR. Its tests' failures are expected (pytest exits 1); any other failure to run is not."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "OMP_NUM_THREADS": "1"}
    # Its timeout is under pytest-timeout's 300 s, so a hang says where it hung.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--tb=no", "--no-header", "-p", "no:cacheprovider",
         "-p", PLUGIN, f"--ttir-report={report}", *tests],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode in (0, 1) and report.exists(), (
        f"the TTIR session did not run (exit {done.returncode}):\n"
        f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    report_data: dict[str, Any] = json.loads(report.read_text())
    return report_data


def describe(errors: list[dict[str, str]]) -> str:
    return "\n\n".join(f"{e['kernel']} launched by {e['test']}\n  signature {e['signature']}\n"
                       f"  constexprs {e['constexprs']}\n{e['error']}" for e in errors)


@pytest.mark.slow
def test_every_kernel_compiles_to_ttir_for_sm90(tmp_path: Path) -> None:
    tests = [str(Path("packages", name, path)) for name, (_, path) in PACKAGES.items()]
    report = run_ttir_session(tests, tmp_path / "ttir.json", ROOT)
    assert not report["errors"], "launches that fail to compile on the GPU:\n" + describe(
        report["errors"])
    for name, (src, _) in PACKAGES.items():
        defined = jit_functions(ROOT / "packages" / name / src)
        assert defined, f"no @triton.jit function found in {name}: is the path right?"
        missed = sorted(defined - set(report["reached"]))
        assert not missed, (
            f"@triton.jit functions of {name} that no CPU kernel test launches (or calls from a "
            f"launched kernel), so nothing checks that they compile: {missed}")


BROKEN_LAUNCH = '''
import torch
import triton
import triton.language as tl


@triton.jit
def _doubled_or_same(x, DOUBLE: tl.constexpr):
    if DOUBLE:
        return x.to(tl.float32) * 2.0
    return x


@triton.jit
def broken(x_ptr, out_ptr, DOUBLE: tl.constexpr):
    tl.store(out_ptr, _doubled_or_same(tl.load(x_ptr), DOUBLE))


def test_launch():
    x = torch.zeros(4, dtype=torch.bfloat16)
    broken[(1,)](x, x, DOUBLE=True)
    broken[(1,)](x, x, DOUBLE=True)  # the same variant: reported once
'''


def test_the_plugin_reports_a_launch_that_does_not_compile(tmp_path: Path) -> None:
    (tmp_path / "test_broken_launch.py").write_text(BROKEN_LAUNCH)
    report = run_ttir_session(["test_broken_launch.py"], tmp_path / "ttir.json", tmp_path)
    assert report["target"] == "cuda:90"
    assert report["kernels"] == {}
    [error] = report["errors"]
    assert error["kernel"] == "test_broken_launch.broken"
    assert error["test"] == "test_broken_launch.py::test_launch"
    assert "fp32 and bf16" in error["error"]  # the return type mismatch, from the cause
