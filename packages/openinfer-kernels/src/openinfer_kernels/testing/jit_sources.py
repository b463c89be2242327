"""The `@triton.jit` functions a source tree defines, found by reading the files (nothing is
imported, so this works in interpreter mode and without triton)."""

from __future__ import annotations

import ast
from pathlib import Path


def _is_triton_jit(decorator: ast.expr) -> bool:
    """`@triton.jit` or `@triton.jit(...)`."""
    if isinstance(decorator, ast.Call):
        decorator = decorator.func
    return (isinstance(decorator, ast.Attribute) and decorator.attr == "jit"
            and isinstance(decorator.value, ast.Name) and decorator.value.id == "triton")


def jit_functions(src: Path) -> set[str]:
    """module.name of every module-level `@triton.jit` function under `src`, a folder that
    holds top-level packages (a package's `src/`)."""
    found = set()
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef) and any(
                    _is_triton_jit(d) for d in node.decorator_list):
                found.add(f"{module}.{node.name}")
    return found
