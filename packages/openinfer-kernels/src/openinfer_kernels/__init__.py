"""openinfer-kernels: device ops, each a Triton kernel beside its plain-torch reference.

Every public op dispatches on its input's device: the reference (fp32 math) on CPU; on CUDA the
Triton kernel where one exists (and triton is installed), else the reference. Names are imported
on first use so that plugin discovery (which imports this package) never pulls in torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# No op folder is named as an op it exports: importing a subpackage sets the package attribute
# of its name, which would shadow the op.
_EXPORTS = {
    "embedding": "openinfer_kernels.embed",
    "embedding_part": "openinfer_kernels.embed",
    "rms_norm": "openinfer_kernels.norm",
    "fused_add_rms_norm": "openinfer_kernels.norm",
    "qk_rms_norm": "openinfer_kernels.norm",
    "qk_norm_rope": "openinfer_kernels.rotary",
    "qk_norm_rope_append": "openinfer_kernels.rotary",
    "rope_cos_sin": "openinfer_kernels.rotary",
    "rotary_embedding": "openinfer_kernels.rotary",
    "silu_and_mul": "openinfer_kernels.activation",
    "kv_append": "openinfer_kernels.kv_store",
    "paged_attention": "openinfer_kernels.attention",
    "lm_head_logits": "openinfer_kernels.lm_head",
    "linear": "openinfer_kernels.gemm",
    "linear_add_rms_norm": "openinfer_kernels.gemm",
    "linear_silu_mul": "openinfer_kernels.gemm",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from openinfer_kernels.activation import silu_and_mul
    from openinfer_kernels.attention import paged_attention
    from openinfer_kernels.embed import embedding, embedding_part
    from openinfer_kernels.gemm import linear, linear_add_rms_norm, linear_silu_mul
    from openinfer_kernels.kv_store import kv_append
    from openinfer_kernels.lm_head import lm_head_logits
    from openinfer_kernels.norm import fused_add_rms_norm, qk_rms_norm, rms_norm
    from openinfer_kernels.rotary import (
        qk_norm_rope,
        qk_norm_rope_append,
        rope_cos_sin,
        rotary_embedding,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'openinfer_kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
