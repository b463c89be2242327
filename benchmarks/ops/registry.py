"""The kernel benchmarks' op registry. An op names its cases (the shapes it runs at), how to
build a case's inputs, the implementations to time on them, the reference from the kernel
package that each must match, and the work one call does (FLOPs, bytes moved), from which the
runner sets each time beside the machine's ceiling. Op modules (`attention.py`, `gemm.py`,
`sampling.py` beside this file) call `register_op` when imported; `run.py` imports them all.

Imports of openinfer stay inside the builders and implementations, so a base run (`--base`)
times the baseline's kernels through the same op definitions."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Call = Callable[[], object]
# Given one copy of a case's inputs, the call to time; None where the implementation does not
# apply to that case (a FlashInfer call without FlashInfer installed, a mode it lacks).
Impl = Callable[[Any], Call | None]
# How a call is timed (benchmarks/ops/timing.py): one call's share of a CUDA graph over every
# copy of the inputs, the median of CUDA events around single calls, the device time of the
# kernels a call launches (the profiler's sum), or host wall time of back-to-back calls.
Timing = Literal["graph", "events", "kernels", "wall"]


@dataclass(frozen=True, slots=True)
class Case:
    """One shape an op runs at: `label` names it in tables, `params` go into every row."""

    label: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Work:
    """What one call must do at least: FLOPs and bytes moved (read + written)."""

    flops: float = 0.0
    bytes: float = 0.0

    def floor_us(self, read_gbps: float, matmul_tflops: float) -> float:
        """The least time for this work at the machine's ceilings (the roofline's floor)."""
        return max(self.bytes / (read_gbps * 1e3) if read_gbps else 0.0,
                   self.flops / (matmul_tflops * 1e6) if matmul_tflops else 0.0)


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    doc: str
    cases: tuple[Case, ...]
    # Copies of one case's inputs: graph timing runs the call over each (so none is served
    # from L2); the other timings use the first.
    build: Callable[[Case], Sequence[Any]]
    impls: Mapping[str, Impl]
    work: Callable[[Case], Work]
    timing: Timing = "graph"
    # Given one copy, what every implementation's result must match (`tolerance`: rtol, atol).
    reference: Callable[[Any], object] | None = None
    tolerance: tuple[float, float] = (2**-5, 5e-2)
    # Launch settings to sweep (`--sweep`): more implementations per case, for tile searches.
    sweep: Callable[[Case], Mapping[str, Impl]] | None = None


_OPS: dict[str, Op] = {}


def register_op(name: str, *, doc: str, cases: Sequence[Case],
                build: Callable[[Case], Sequence[Any]], impls: Mapping[str, Impl],
                work: Callable[[Case], Work], timing: Timing = "graph",
                reference: Callable[[Any], object] | None = None,
                tolerance: tuple[float, float] = (2**-5, 5e-2),
                sweep: Callable[[Case], Mapping[str, Impl]] | None = None) -> Op:
    """Add an op under `name`; a second op of the same name is a mistake in the op modules."""
    if name in _OPS:
        raise ValueError(f"op {name!r} is registered twice")
    labels = [c.label for c in cases]
    if len(set(labels)) != len(labels):
        raise ValueError(f"op {name!r}: case labels repeat: {labels}")
    op = Op(name, doc, tuple(cases), build, dict(impls), work, timing, reference, tolerance,
            sweep)
    _OPS[name] = op
    return op


def get_op(name: str) -> Op:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"no op {name!r}; registered: {', '.join(sorted(_OPS))}") from None


def list_ops() -> list[str]:
    return sorted(_OPS)


def select(names: str | None) -> list[Op]:
    """The ops of a comma-separated list (`--ops a,b`), or every op for None / "all"."""
    if names in (None, "", "all"):
        return [_OPS[n] for n in list_ops()]
    assert names is not None
    return [get_op(n.strip()) for n in names.split(",") if n.strip()]
