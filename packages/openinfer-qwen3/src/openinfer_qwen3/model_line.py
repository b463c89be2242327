"""The Qwen3 model line: what the engine calls to load a Qwen3 checkpoint (or, under tensor
parallelism, one rank's shard of it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from openinfer_core.interfaces.model import LoadOptions
from openinfer_core.weights.checkpoint import open_checkpoint
from openinfer_core.weights.kv_scales import read_kv_scales
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.fp8_weights import keep_fp8_weights
from openinfer_qwen3.model import Qwen3Model
from openinfer_qwen3.weights import Qwen3Shard, load_weights


class Qwen3ModelLine:
    name: ClassVar[str] = "qwen3"
    supports_tensor_parallel: ClassVar[Literal[True]] = True
    online_quantization: ClassVar[frozenset[str]] = frozenset({"fp8"})  # --quantization
    supports_fp8_kv_cache: ClassVar[Literal[True]] = True

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any], options: LoadOptions) -> Qwen3Model:
        cfg = Qwen3Config.from_dict(config)
        max_len = options.model_len(cfg.max_position_embeddings)
        tp = options.tensor_parallel
        shard = None if tp is None else Qwen3Shard.of(cfg, tp.rank, tp.size)
        ckpt = open_checkpoint(model_dir, options.load_format,
                               std=float(config.get("initializer_range", 0.02)))
        try:
            # FP8 linears (stored, or quantized for `--quantization fp8`) stay FP8 on the GPU
            # unless OPENINFER_FP8_WEIGHTS=dequantize.
            quantize = options.quantization == "fp8"
            keep = keep_fp8_weights(options.device)
            weights = load_weights(ckpt, cfg, dtype=options.dtype, device=options.device,
                                   shard=shard, keep_fp8=keep, quantize=quantize)
            kv_scales = None
            if options.kv_cache_dtype is not None:
                base = "model." if "model.embed_tokens.weight" in ckpt else ""
                kv_scales = read_kv_scales(
                    ckpt, [f"{base}layers.{n}.self_attn." for n in range(cfg.num_layers)],
                    cfg.num_kv_heads)
        finally:
            ckpt.close()
        model = Qwen3Model(cfg, weights, options.attention, max_model_len=max_len,
                           device=options.device, dtype=options.dtype, tp=tp, shard=shard,
                           kv_cache_dtype=options.kv_cache_dtype, kv_scales=kv_scales)
        return model
