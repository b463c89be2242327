"""Tiny Qwen3 checkpoints in HF's block-scaled FP8 layout (Qwen3-*-FP8), for the FP8 tests:
random weights quantized here (scale = block amax / 448, e4m3 rounding), written beside a plain
fp32 checkpoint holding the same weights dequantized (`write_pair`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from openinfer_core import SamplingParams
from openinfer_core.weights.safetensors_writer import write_safetensors
from openinfer_qwen3.config import Qwen3Config
from openinfer_qwen3.random_weights import tensor_shapes

BLOCK = 128
E4M3_MAX = 448.0
FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
              "weight_block_size": [BLOCK, BLOCK]}
_BASE: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 384, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0, "torch_dtype": "bfloat16", "eos_token_id": 0,
}
SPECS = {
    # Every linear has partial blocks (k/v: 96 rows of one block; hidden 192 = 1.5 blocks),
    # and the second rank's q, k/v and MLP parts all start inside a block.
    "partial-blocks": {**_BASE, "hidden_size": 192, "head_dim": 48, "intermediate_size": 320,
                       "tie_word_embeddings": False},
    # Whole blocks, except k/v's split (64 rows a rank); the second rank's q and MLP parts
    # start on a block boundary.
    "whole-blocks": {**_BASE, "hidden_size": 256, "head_dim": 64, "intermediate_size": 512,
                     "tie_word_embeddings": True},
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[(37 * i + 11 * j) % 384 for j in range(3 + 5 * i)] for i in range(8)]


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [O, I] fp32 -> e4m3 values and float32 scales [ceil(O/128), ceil(I/128)], one per
    block: amax / 448, so each block's largest value maps to e4m3's largest."""
    rows, cols = w.shape
    grid = (-(-rows // BLOCK), -(-cols // BLOCK))
    padded = F.pad(w, (0, grid[1] * BLOCK - cols, 0, grid[0] * BLOCK - rows))
    blocks = padded.view(grid[0], BLOCK, grid[1], BLOCK)
    scale = (blocks.abs().amax(dim=(1, 3)) / E4M3_MAX).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    q = q.to(torch.float8_e4m3fn).view(grid[0] * BLOCK, grid[1] * BLOCK)
    return q[:rows, :cols].contiguous(), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The oracle: each e4m3 value times its block's scale, in fp32."""
    rows, cols = q.shape
    s = scale.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return q.float() * s


def write_pair(config: dict[str, Any], root: Path) -> tuple[Path, Path]:
    """(the FP8 checkpoint, the plain fp32 one of the same weights dequantized), each sharded
    with an index like a published checkpoint."""
    cfg = Qwen3Config.from_dict(config)
    gen = torch.Generator().manual_seed(0)
    fp8: dict[str, torch.Tensor] = {}
    plain: dict[str, torch.Tensor] = {}
    for name, shape in tensor_shapes(cfg).items():
        values = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight"):
            values = 1.0 + 0.2 * values
        if name.endswith("_proj.weight"):
            q, scale = quantize(0.25 * values)
            fp8[name], fp8[name.removesuffix("weight") + "weight_scale_inv"] = q, scale
            plain[name] = dequantize(q, scale)
        else:  # norms, embedding, LM head: bf16 in the FP8 checkpoint
            fp8[name] = (0.25 * values if values.dim() == 2 else values).to(torch.bfloat16)
            plain[name] = fp8[name].float()
    paths = (root / "fp8", root / "plain")
    for path, tensors, quant in zip(paths, (fp8, plain), (FP8_CONFIG, None), strict=True):
        write_folder(path, config, tensors, quant)
    return paths


def write_folder(path: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                 quant: dict[str, Any] | None) -> Path:
    path.mkdir(parents=True)
    written = dict(config, quantization_config=quant) if quant else dict(config)
    (path / "config.json").write_text(json.dumps(written))
    write_safetensors(path, {n: tuple(t.shape) for n, t in tensors.items()},
                      {n: t.dtype for n, t in tensors.items()}, tensors.__getitem__,
                      max_shard_bytes=256 << 10)
    assert (path / "model.safetensors.index.json").is_file()
    return path
