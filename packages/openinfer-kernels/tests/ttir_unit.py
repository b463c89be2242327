"""`openinfer_kernels.testing.ttir`: a launch's variant is what Triton's own binder makes of
its arguments for an sm90 GPU, and compiling it to TTIR on CPU raises the front-end errors
that the interpreter lets through (here two return types behind a constexpr branch, the bug
that once passed every CPU test and failed to compile on an H100).

Run by `test_ttir.py` in a process of its own with the interpreter off: in the suite's
process the interpreter, once it has run a kernel, has replaced parts of `triton.language`
that the compiler then trips over."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

triton = pytest.importorskip("triton")

from openinfer_kernels.testing import ttir  # noqa: E402  (needs triton)


@pytest.fixture(scope="module")
def cases() -> ModuleType:
    """`ttir_cases.py` imported with the interpreter off, whatever this process runs under,
    so its kernels are JITFunctions that compile."""
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = False
        spec = importlib.util.spec_from_file_location(
            "ttir_cases", Path(__file__).with_name("ttir_cases.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


POINTER_TYPES = {
    torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32",
    torch.float64: "*fp64", torch.int8: "*i8", torch.uint8: "*u8", torch.int16: "*i16",
    torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*u1",
    torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5",
}


@pytest.mark.parametrize("dtype", POINTER_TYPES, ids=str)
def test_a_launch_is_typed_as_on_the_gpu(cases: ModuleType, dtype: torch.dtype) -> None:
    t = torch.zeros(16, dtype=dtype)
    variant = ttir.launch_variant(cases.every_argument, (t, 5, 2**40, 1, 0.5, True, None), {})
    assert variant.kernel == "ttir_cases.every_argument"
    assert variant.signature == {
        "t_ptr": POINTER_TYPES[dtype], "small": "i32", "large": "i64",
        "one": "constexpr",  # Triton makes an int equal to 1 a constant
        "f": "fp32", "b": "u1", "nothing": "constexpr", "BLOCK": "constexpr"}
    assert variant.constexprs == {(3,): 1, (6,): None, (7,): 16}  # BLOCK from its default
    assert variant.attrs[(0,)] == [["tt.divisibility", 16]]  # a 16-byte aligned pointer
    ttir.compile_variant(cases.every_argument, variant)


def test_launches_that_compile_alike_share_a_key(cases: ModuleType) -> None:
    t = torch.zeros(16)
    first = ttir.launch_variant(cases.every_argument, (t, 5, 7, 1, 0.5, True, None), {})
    again = ttir.launch_variant(cases.every_argument, (t, 9, 11, 1, 2.5, False, None), {})
    wider = ttir.launch_variant(cases.every_argument, (t, 5, 7, 1, 0.5, True, None),
                                {"BLOCK": 32})
    assert first.key == again.key != wider.key


def test_two_return_types_fail_to_compile(cases: ModuleType) -> None:
    x = torch.zeros(1, dtype=torch.bfloat16)
    variant = ttir.launch_variant(cases.two_return_types, (x, x), {"DOUBLE": True})
    with pytest.raises(triton.compiler.errors.CompilationError) as raised:
        ttir.compile_variant(cases.two_return_types, variant)
    # Triton 3.9 says "Return type mismatch: fp32 and bf16" (3.6: "Inconsistent return types").
    assert "fp32 and bf16" in ttir.error_text(raised.value)


def test_one_return_compiles_and_names_what_it_calls(cases: ModuleType) -> None:
    x = torch.zeros(1, dtype=torch.bfloat16)
    for double in (True, False):
        variant = ttir.launch_variant(cases.one_return_type, (x, x), {"DOUBLE": double})
        module = ttir.compile_variant(cases.one_return_type, variant)
        assert ttir.called_functions(module) == {"ttir_cases._doubled_or_same_once"}


def test_an_interpreted_kernel_is_refused() -> None:
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True

        @triton.jit
        def interpreted(x_ptr):
            pass

    with pytest.raises(TypeError, match="TRITON_INTERPRET"):
        ttir.launch_variant(interpreted, (torch.zeros(1),), {})
