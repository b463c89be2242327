"""The Qwen3.5 model line: what the engine calls to load a Qwen3.5 checkpoint (the language
model of either published form)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.model import LoadOptions
from openinfer_core.weights.checkpoint import open_checkpoint
from openinfer_qwen35.config import Qwen35Config
from openinfer_qwen35.model import Qwen35Model
from openinfer_qwen35.weights import load_weights


class Qwen35ModelLine:
    name: ClassVar[str] = "qwen3.5"

    @classmethod
    def load(cls, model_dir: Path, config: dict[str, Any], options: LoadOptions) -> Qwen35Model:
        cfg = Qwen35Config.from_dict(config)
        max_len = options.model_len(cfg.max_position_embeddings)
        if options.tensor_parallel is not None:
            raise ModelConfigError("qwen3.5: tensor parallelism is not supported yet")
        text = config.get("text_config") or config
        std = float(text.get("initializer_range", 0.02))
        ckpt = open_checkpoint(model_dir, options.load_format, std=std)
        try:
            weights = load_weights(ckpt, cfg, dtype=options.dtype, device=options.device)
        finally:
            ckpt.close()
        return Qwen35Model(cfg, weights, options.attention, max_model_len=max_len,
                           device=options.device, dtype=options.dtype)
