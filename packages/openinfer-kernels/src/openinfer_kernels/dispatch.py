"""Choosing an op's implementation by the device of its input."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
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


def triton_kernels(module: str) -> ModuleType | None:
    """Import an op folder's `triton.py`; None where triton is not installed, so that the package
    still imports there and every op runs its reference. Any other import error is a bug in the
    kernel module and propagates."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise
        return None
