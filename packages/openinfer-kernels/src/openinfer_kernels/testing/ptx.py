"""A Triton kernel compiled for sm90 (`ttir.TARGET`) down to PTX and through ptxas, on a
machine without a GPU, and the order of its global memory accesses around its PDL wait: what
the tests of kernels that read (or compute) before `pdl_enter` check (`openinfer_kernels.pdl`).
Import with `TRITON_INTERPRET` unset or 0 (`compiled_session.run_compiled_session` runs such a
test file in a process of its own)."""

from __future__ import annotations

from typing import Any

import triton
from triton.compiler import ASTSource

from openinfer_kernels.testing.ttir import TARGET

WAIT = "wait"


def compile_ptx(kernel: Any, signature: dict[str, Any], constexprs: dict[str, Any]) -> str:
    """`kernel` compiled for sm90 with `signature` (a Triton type per runtime parameter) and
    `constexprs`; its PTX, after ptxas has made a cubin of it."""
    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=TARGET)
    assert compiled.asm["cubin"], "ptxas made no cubin"
    return str(compiled.asm["ptx"])


def around_the_wait(ptx: str) -> tuple[list[str], list[str]]:
    """The global loads and stores before and after the PTX's one `griddepcontrol.wait`, in
    program order, each as its opcode less `.global` and its qualifiers but its width
    ("ld.b16", "st.b32", "ld.v4.b32": a load of four 32-bit words)."""
    order = []
    for line in ptx.splitlines():
        words = line.split()
        if words and words[0].startswith("@"):  # a predicate
            words = words[1:]
        if "griddepcontrol.wait" in line:
            order.append(WAIT)
        elif words and words[0].startswith(("ld.global", "st.global")):
            parts = words[0].split(".")
            kept = [parts[0]] + [p for p in parts[1:] if p.startswith(("v", "b", "u", "s", "f"))
                                 and p[1:].isdigit()]
            order.append(".".join(kept))
    assert order.count(WAIT) == 1, f"{order.count(WAIT)} griddepcontrol.wait in the PTX"
    at = order.index(WAIT)
    return order[:at], order[at + 1:]
