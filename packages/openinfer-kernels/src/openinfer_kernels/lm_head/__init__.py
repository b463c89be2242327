from openinfer_kernels.dispatch import by_device
from openinfer_kernels.lm_head.cublas import lm_head_logits_cublas
from openinfer_kernels.lm_head.reference import lm_head_logits_ref

lm_head_logits = by_device(lm_head_logits_ref, lm_head_logits_cublas)

__all__ = ["lm_head_logits", "lm_head_logits_cublas", "lm_head_logits_ref"]
