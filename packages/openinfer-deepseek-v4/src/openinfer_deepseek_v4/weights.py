"""DeepSeek-V4 weights from a checkpoint folder, in whichever names it uses: DeepSeek's (its HF
repository, FP8/FP4 or not; also what transformers' `save_pretrained` writes) or transformers'
module names (a state dict saved as it is). `--load-format dummy` makes them up at DeepSeek's
names and shapes (`dummy_weights.py`). Read a tensor at a time, onto the device; quantized
weights are dequantized to the model's dtype, or kept in their formats for the kernels."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

from openinfer_core.errors import ModelConfigError
from openinfer_core.weights.checkpoint import Checkpoint
from openinfer_core.weights.random_checkpoint import RandomCheckpoint
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.deepseek_names import weights_from_deepseek
from openinfer_deepseek_v4.dummy_weights import DummyTensors
from openinfer_deepseek_v4.hf_names import weights_from_transformers
from openinfer_deepseek_v4.reference import ModelWeights
from openinfer_deepseek_v4.shard import DeepseekV4Shard

# transformers' module names of the tensors the spec keeps in fp32
_FP32_IN_TRANSFORMERS = ("_hc.", "hc_head.", ".sinks", "position_bias", "e_score_correction_bias")


def load_weights(ckpt: Checkpoint | RandomCheckpoint, cfg: DeepseekV4Config, *,
                 dtype: torch.dtype, device: torch.device, keep_quantized: bool = False,
                 shard: DeepseekV4Shard | None = None) -> ModelWeights:
    """With `keep_quantized`, FP8 and FP4 weights stay in their formats (and dummy weights are
    made in them: V4-Flash's formats at its shapes). With `shard`, a tensor-parallel rank's
    part, reading only its slices and experts from a checkpoint."""
    if isinstance(ckpt, RandomCheckpoint):
        return weights_from_deepseek(DummyTensors(ckpt, cfg, dtype, device,
                                                  formats=keep_quantized),
                                     cfg, dtype=dtype, keep_quantized=keep_quantized,
                                     shard=shard)
    names = ckpt.names()
    if any(".self_attn." in name for name in names):  # transformers' module names
        if shard is not None and shard.size > 1:
            raise ModelConfigError(
                f"{ckpt.folder}: tensor parallelism reads DeepSeek's tensor names (its HF "
                "repository's, or what transformers' save_pretrained writes); this checkpoint "
                "has transformers' module names: save it with save_pretrained first")

        def cast(name: str) -> torch.dtype:
            return torch.float32 if any(s in name for s in _FP32_IN_TRANSFORMERS) else dtype

        return weights_from_transformers(_CheckpointTensors(ckpt, names, device, cast), cfg)
    return weights_from_deepseek(_CheckpointTensors(ckpt, names, device, None), cfg,
                                 dtype=dtype, keep_quantized=keep_quantized, shard=shard)


class _CheckpointTensors(Mapping[str, torch.Tensor]):
    """A checkpoint as a lazy state dict: each tensor read when asked for, onto `device`,
    floating-point ones cast to `cast(name)` (integer ones and, without `cast`, all as
    stored)."""

    def __init__(self, ckpt: Checkpoint, names: set[str], device: torch.device,
                 cast: Callable[[str], torch.dtype] | None) -> None:
        self._ckpt, self._names, self._device, self._cast = ckpt, names, device, cast

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._cast_to(name, self._ckpt.get(name, device=self._device))

    def part(self, name: str, dim: int, part: range) -> torch.Tensor:
        """Rows or columns `part` of tensor `name`, reading only those bytes."""
        return self._cast_to(name, self._ckpt.get_part(name, shape=self._ckpt.shape(name),
                                                       dim=dim, part=part, device=self._device))

    def shape(self, name: str) -> tuple[int, ...]:
        return self._ckpt.shape(name)

    def _cast_to(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if self._cast is not None and t.is_floating_point():
            t = t.to(self._cast(name))
        return t

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
