"""Run a test file in a pytest process of its own with the Triton interpreter off: a session
that runs kernels under the interpreter has patched `triton.language` in a way the compiler
cannot work with, so tests that compile kernels (to TTIR, PTX or a cubin, no GPU needed) run
apart."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def run_compiled_session(test_file: Path, min_passed: int, timeout: float = 300) -> str:
    """Run `test_file` with TRITON_INTERPRET=0; returns pytest's summary line. Raises
    AssertionError (with the output's tail) unless it passed at least `min_passed` tests and
    failed none: tests that stopped being collected fail this too."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         str(test_file)],
        env=env, capture_output=True, text=True, timeout=timeout, check=False)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= min_passed and "failed" not in summary, summary
    return summary
