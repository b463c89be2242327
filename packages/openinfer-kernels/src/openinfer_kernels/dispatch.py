"""Choosing an op's implementation by the device of its input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def by_device(reference: F, triton: F | None = None) -> F:
    """`reference` on CPU tensors (and on CUDA until a Triton kernel is given), `triton` on CUDA
    tensors. The first tensor argument decides."""
    if triton is None:
        return reference

    def op(*args: Any, **kwargs: Any) -> Any:
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is not None and first.is_cuda:
            return triton(*args, **kwargs)
        return reference(*args, **kwargs)

    op.__doc__ = reference.__doc__
    op.__name__ = reference.__name__.removesuffix("_ref")
    return op  # type: ignore[return-value]
