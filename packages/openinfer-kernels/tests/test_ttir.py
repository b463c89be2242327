"""The TTIR helper's own tests (`ttir_unit.py`), in a pytest process of their own with the
Triton interpreter off: this process runs kernels under the interpreter, which patches
`triton.language` in a way the compiler cannot work with."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_the_ttir_helper_passes_its_tests_with_the_interpreter_off() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         str(Path(__file__).with_name("ttir_unit.py"))],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 15 and "failed" not in summary, summary
