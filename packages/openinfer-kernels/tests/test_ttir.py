"""The TTIR helper's own tests (`ttir_unit.py`), in a pytest process of their own with the
Triton interpreter off: this process runs kernels under the interpreter, which patches
`triton.language` in a way the compiler cannot work with."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")

from openinfer_kernels.testing.compiled_session import run_compiled_session


def test_the_ttir_helper_passes_its_tests_with_the_interpreter_off() -> None:
    run_compiled_session(Path(__file__).with_name("ttir_unit.py"), min_passed=15)
