"""The DeepSeek-V4 model line: what the engine calls to load a DeepSeek-V4 checkpoint (or,
under tensor parallelism, one rank's shard of it: `shard.py`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, Literal

from openinfer_core.interfaces.model import LoadOptions
from openinfer_core.weights.checkpoint import open_checkpoint
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.model import DeepseekV4Model
from openinfer_deepseek_v4.quant_sim import quant_sim_for
from openinfer_deepseek_v4.shard import DeepseekV4Shard
from openinfer_deepseek_v4.weights import load_weights


class DeepseekV4ModelLine:
    name: ClassVar[str] = "deepseek-v4"
    supports_tensor_parallel: ClassVar[Literal[True]] = True
    supports_expert_parallel: ClassVar[Literal[True]] = True

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any],
             options: LoadOptions) -> DeepseekV4Model:
        cfg = dataclasses.replace(DeepseekV4Config.from_dict(config),
                                  quant_sim=quant_sim_for(config))
        max_len = options.model_len(cfg.max_position_embeddings)
        tp = options.tensor_parallel
        shard = None if tp is None else DeepseekV4Shard.of(cfg, tp.rank, tp.size,
                                                           options.expert_parallel)
        ckpt = open_checkpoint(model_dir, options.load_format,
                               std=float(config.get("initializer_range", 0.02)))
        try:
            # On the GPU the FP8/FP4 weights stay in their formats (V4-Flash fits no other
            # way); the CPU path dequantizes them at load, for the plain-torch reference ops.
            weights = load_weights(ckpt, cfg, dtype=options.dtype, device=options.device,
                                   keep_quantized=options.device.type == "cuda", shard=shard)
        finally:
            ckpt.close()
        # The attention backend is not used: the sparse, compressed attention runs its own
        # ops (paged_attention.py).
        model = DeepseekV4Model(cfg, weights, max_model_len=max_len, device=options.device,
                                dtype=options.dtype, tp=tp, shard=shard)
        return model
