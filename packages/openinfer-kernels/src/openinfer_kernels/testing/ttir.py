"""Compile a Triton kernel to TTIR for an sm90 target (H100/H200) on a machine without a GPU.

TTIR is the IR that Triton's front end makes from a kernel's Python source: building it runs
the code generator, which is where errors of the kind the interpreter never sees are raised
(two returns of different types behind a constexpr branch, an undefined name in a branch the
CPU cases never take, a `tl.constexpr` used as a runtime value). The later passes (TTGIR, PTX)
are not run: they need no more of the source, only the CUDA toolchain.

`launch_variant` computes what a launch on the GPU would compile: it binds the launch's
arguments with Triton's own binder for the CUDA backend (the code `JITFunction.run` runs), so
the signature is Triton's (pointer types for tensors of every dtype, float8 ones included;
i32 or i64 by an int's range; an int equal to 1 made a constant; divisibility by 16 as an
attribute; `tl.constexpr` parameters and defaults as constants), without asking a driver for
the device. Needs the `triton` package, imported with `TRITON_INTERPRET` unset or 0 for
`launch_variant` (the interpreter replaces every `@triton.jit` function by one it runs)."""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from functools import cache
from typing import Any

import triton._C.libtriton as libtriton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, create_function_from_signature

# sm90 with 32-thread warps: the H100 and H200 that the kernels are tuned for.
TARGET = GPUTarget("cuda", 90, 32)


@dataclass(frozen=True, slots=True)
class Variant:
    """One specialization of a kernel, as a launch on the GPU would compile it: the parts
    `JITFunction.run` hands to Triton's compiler."""

    kernel: str  # the @triton.jit function's module.qualname
    signature: dict[str, str]  # parameter name -> Triton type ("*bf16", "i32", "constexpr")
    constexprs: dict[tuple[int, ...], Any]  # parameter path -> value
    attrs: dict[tuple[int, ...], Any]  # parameter path -> attributes (tt.divisibility)
    options: Any  # the backend's options (num_warps, num_stages, ...)

    @property
    def key(self) -> str:
        """Equal for two launches that compile the same code."""
        return repr((self.kernel, sorted(self.signature.items()),
                     sorted(self.constexprs.items()), sorted(self.attrs.items()),
                     self.options))


def qualified_name(kernel: Any) -> str:
    """module.qualname of a @triton.jit function (compiled or interpreted)."""
    return f"{kernel.fn.__module__}.{kernel.fn.__qualname__}"


@cache
def _backend() -> CUDABackend:
    return CUDABackend(TARGET)


_binders: dict[int, tuple[JITFunction, Any]] = {}


def _binder(kernel: JITFunction) -> Any:
    """Triton's argument binder for `kernel` on the CUDA backend, made once per kernel."""
    entry = _binders.get(id(kernel))
    if entry is None or entry[0] is not kernel:
        entry = (kernel, create_function_from_signature(kernel.signature, kernel.params,
                                                        _backend()))
        _binders[id(kernel)] = entry
    return entry[1]


def _require_compiled(kernel: Any) -> JITFunction:
    if not isinstance(kernel, JITFunction):
        raise TypeError(
            f"{kernel!r} is not a JITFunction: triton was imported with TRITON_INTERPRET=1, "
            "which makes every @triton.jit function interpreted; import it with "
            "TRITON_INTERPRET=0 (or unset) to compile kernels")
    return kernel


def launch_variant(kernel: JITFunction, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Variant:
    """The variant that `kernel[grid](*args, **kwargs)` would compile on an sm90 GPU. Tensors
    may be on any device (only their dtype and address are read). Raises what the launch
    would raise for arguments that do not bind (a missing parameter, an unknown keyword)."""
    kernel = _require_compiled(kernel)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    bound, specialization, options = _binder(kernel)(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        _backend(), kwargs, bound, specialization, options)
    return Variant(qualified_name(kernel), signature, constexprs, attrs, options)


def compile_variant(kernel: JITFunction, variant: Variant) -> Any:
    """`variant` of `kernel` compiled to TTIR (an MLIR module); raises
    `triton.compiler.errors.CompilationError` where the GPU's compile would."""
    return compile_ttir(kernel, variant.signature, variant.constexprs, variant.attrs,
                        variant.options)


def compile_ttir(kernel: JITFunction, signature: dict[str, str],
                 constexprs: dict[Any, Any] | None = None,
                 attrs: dict[Any, Any] | None = None, options: Any = None) -> Any:
    """`kernel` compiled to TTIR for `TARGET`, from an explicit signature: a Triton type per
    runtime parameter ("*fp16", "i32", "fp32", "i1"); `constexprs` maps parameter names (or
    Triton's index paths) to values, and a named one needs no signature entry. `options`:
    the backend's defaults (4 warps, 3 stages) where None."""
    kernel = _require_compiled(kernel)
    signature = dict(signature)
    for name in constexprs or {}:
        if isinstance(name, str):
            signature.setdefault(name, "constexpr")
    backend = _backend()
    if options is None:
        options = backend.parse_options({})
    # Triton reads the interpreter switch while compiling too (constexpr functions return
    # plain values under it), so it is off for the compile whatever the environment says.
    with knobs.runtime.scope():
        knobs.runtime.interpret = False
        context = libtriton.ir.context()
        libtriton.ir.load_dialects(context)
        backend.load_dialects(context)
        source = ASTSource(kernel, signature, constexprs, attrs)
        return source.make_ir(TARGET, options, backend.get_codegen_implementation(options),
                              backend.get_module_map(), context)


_FUNC = re.compile(r'tt\.func (?:public |private )?@"?([^\s("]+)')
_MANGLED = re.compile(r"(?<=[^._])__.*$")


def called_functions(module: Any) -> set[str]:
    """module.qualname of every @triton.jit function that a compiled kernel calls (Triton's
    own included). TTIR is taken before inlining, so each callee is still a function of its
    own, named by its qualified name and `__` then its argument types."""
    names = set()
    for name in _FUNC.findall(module.str_nodebug()):
        # The argument types may hold dots (constants such as 1.0): the name ends at the
        # first `__` that follows a name's character.
        name = _MANGLED.sub("", name)
        if "." in name:  # the entry is named by its bare name
            names.add(name)
    return names


def error_text(exc: BaseException) -> str:
    """`exc`'s message and its causes': Triton's CompilationError points at the call in the
    kernel and keeps the callee's error (the one that says what is wrong) as its cause."""
    parts: list[str] = []
    cause: BaseException | None = exc
    while cause is not None and len(parts) < 8:
        parts.append("".join(traceback.format_exception_only(type(cause), cause)).strip())
        cause = cause.__cause__ or cause.__context__
    return "\ncaused by: ".join(parts)
