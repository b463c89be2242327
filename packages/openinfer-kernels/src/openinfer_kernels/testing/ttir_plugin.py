"""A pytest plugin that compiles every Triton launch of a test session to TTIR for sm90
instead of running it: `pytest -p openinfer_kernels.testing.ttir_plugin --ttir-report
report.json PATHS` with `TRITON_INTERPRET=0` on a machine without a GPU.

Each launch is bound as on the GPU (`ttir.launch_variant`: the signature from the actual
arguments) and each distinct variant compiled once (`ttir.compile_variant`). Nothing runs, so
tests that check a kernel's numbers fail (they read outputs no kernel wrote) and a test may
stop before its later launches; the session's own results mean nothing here. What counts is
the report, written when the session ends:

    {"triton": version, "target": "cuda:90",
     "kernels": {kernel: variants compiled},        # kernels launched and compiled
     "reached": [function, ...],                    # those and every @triton.jit they call
     "errors": [{"kernel", "test", "signature", "constexprs", "error"}, ...]}

Names are module.qualname. Triton is imported only once collection is done: the kernel tests'
conftest files refuse a session where triton was imported before they could choose the
interpreter."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

_MAX_ERROR_CHARS = 4000


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--ttir-report", metavar="PATH", default=None,
                     help="write the TTIR compile report (JSON) of every Triton launch here")


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise pytest.UsageError(
            "the TTIR check compiles Triton launches instead of interpreting them: run it with "
            "TRITON_INTERPRET=0 in the environment")
    config.pluginmanager.register(TtirCheck(config.getoption("--ttir-report")), "ttir-check")


class TtirCheck:
    """The session's state: variants seen, kernels compiled, functions reached, errors.
    Replaces `JITFunction.run` from the end of collection to the end of the session."""

    def __init__(self, report: str | None) -> None:
        self.report = Path(report) if report else None
        self.test = ""
        self.seen: set[str] = set()
        self.kernels: dict[str, int] = {}
        self.reached: set[str] = set()
        self.errors: list[dict[str, str]] = []
        self._launch: Any = None

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from triton.runtime.jit import JITFunction

        check = self
        self._launch = JITFunction.run

        def compile_instead(kernel: Any, *args: Any, grid: Any, warmup: bool,
                            **kwargs: Any) -> None:
            check.compile(kernel, args, kwargs)

        JITFunction.run = compile_instead

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.test = nodeid

    def compile(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Compile the variant this launch would compile, once per distinct variant."""
        from openinfer_kernels.testing import ttir

        name = ttir.qualified_name(kernel)
        try:
            variant = ttir.launch_variant(kernel, args, kwargs)
        except Exception as exc:  # the GPU's launch would fail here too: reported, not raised
            self._error(name, {}, {}, exc)
            return
        if variant.key in self.seen:
            return
        self.seen.add(variant.key)
        try:
            module = ttir.compile_variant(kernel, variant)
        except Exception as exc:  # a compile error is this check's finding: reported
            self._error(name, variant.signature, variant.constexprs, exc)
            return
        self.kernels[name] = self.kernels.get(name, 0) + 1
        self.reached |= {name, *ttir.called_functions(module)}

    def _error(self, kernel: str, signature: dict[str, str], constexprs: dict[Any, Any],
               exc: Exception) -> None:
        from openinfer_kernels.testing.ttir import error_text

        message = error_text(exc)
        self.errors.append({"kernel": kernel, "test": self.test, "signature": repr(signature),
                            "constexprs": repr(constexprs),
                            "error": message[-_MAX_ERROR_CHARS:]})

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._launch is not None:
            from triton.runtime.jit import JITFunction

            JITFunction.run = self._launch
        if self.report is None:
            return
        import triton

        from openinfer_kernels.testing.ttir import TARGET

        self.report.write_text(json.dumps({
            "triton": triton.__version__, "target": f"{TARGET.backend}:{TARGET.arch}",
            "kernels": dict(sorted(self.kernels.items())), "reached": sorted(self.reached),
            "errors": self.errors}, indent=1))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_sep("=", "TTIR compile check (sm90)")
        terminalreporter.write_line(
            f"{len(self.kernels)} kernels in {sum(self.kernels.values())} variants compiled, "
            f"{len(self.reached)} @triton.jit functions reached, {len(self.errors)} errors")
        for error in self.errors:
            terminalreporter.write_line(f"{error['kernel']} ({error['test']}): "
                                        f"{error['error'].strip().splitlines()[-1]}")
        terminalreporter.write_line("the tests' own results are meaningless here: no kernel ran")
