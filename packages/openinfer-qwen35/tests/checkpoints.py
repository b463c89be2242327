"""Tiny random Qwen3.5 checkpoints in the exact HuggingFace layouts, written by transformers:
`Qwen3_5ForCausalLM` (the language model alone) and `Qwen3_5ForConditionalGeneration` (with a
small vision tower), mixing linear and full-attention layers."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import torch


def _import_transformers_torch_only() -> None:
    """Import transformers' Qwen3.5 with flash-linear-attention hidden: transformers binds
    fla's kernels at import when `fla` imports (this package depends on fla-core), and those
    run on CUDA tensors only, while these tests run transformers on CPU. fla is hidden for
    that import alone, so the GPU tests in the same session still import it (openinfer's
    CPU path never does)."""
    name = "transformers.models.qwen3_5.modeling_qwen3_5"
    if name in sys.modules:
        return
    hidden = {m: sys.modules.pop(m) for m in list(sys.modules)
              if m == "fla" or m.startswith("fla.")}
    sys.modules["fla"] = None  # type: ignore[assignment]
    try:
        importlib.import_module(name)
    finally:
        del sys.modules["fla"]
        sys.modules.update(hidden)


_import_transformers_torch_only()
torch_only_transformers = True  # importing this module is what hides fla (above)

LAYERS = ["linear_attention", "full_attention", "linear_attention", "linear_attention",
          "full_attention"]


def text_config(*, tie: bool, vocab: int = 384) -> dict[str, Any]:
    return {
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": len(LAYERS), "layer_types": LAYERS,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0,
                            "partial_rotary_factor": 0.25},
        "tie_word_embeddings": tie, "initializer_range": 0.2,
    }


def _spread(model: torch.nn.Module, seed: int) -> None:
    """Random norm weights (transformers starts them at 0 = a factor of 1, which would test
    nothing) and random decays."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("dt_bias", "A_log")):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def write_causal_lm(dest: Path, *, tie: bool = True, seed: int = 0) -> Any:
    """A Qwen3_5ForCausalLM checkpoint in `dest`; returns the transformers model (fp32)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text_config(tie=tie))).eval()
    _spread(model, seed)
    model.save_pretrained(dest)
    return model


def write_conditional_generation(dest: Path, *, seed: int = 0) -> Any:
    """A Qwen3_5ForConditionalGeneration checkpoint (vision tower included) in `dest`."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(seed)
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": 64, "patch_size": 4, "num_position_embeddings": 16}
    config = Qwen3_5Config(text_config=text_config(tie=False), vision_config=vision,
                           image_token_id=380, video_token_id=381, vision_start_token_id=382,
                           vision_end_token_id=383, tie_word_embeddings=False)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    _spread(model, seed)
    model.save_pretrained(dest)
    return model
