from openinfer_kernels.dispatch import by_device
from openinfer_kernels.lm_head.cuda import lm_head_logits_cuda
from openinfer_kernels.lm_head.reference import lm_head_logits_ref

lm_head_logits = by_device(lm_head_logits_ref, lm_head_logits_cuda)

__all__ = ["lm_head_logits", "lm_head_logits_cuda", "lm_head_logits_ref"]
