"""DeepSeek's official `inference/model.py` run on CPU in fp32 (spec: shared deepseek-v4.md
§15): loaded from a path given at run time (never copied here), with `kernel_standin` as its
`kernel` module, built with bf16 weights and then cast to fp32. Two things are changed on the
loaded module object, not in its file: `rotate_activation` without its bf16-only assertion (the
stand-in's Hadamard transform instead), and `ParallelHead.get_logits` returning every position
instead of the last.

`run` prefills a prompt at position 0 and decodes greedily a token a step, watching every
`topk` the model takes (the indexer's picks, the router's experts) for equal or nearly equal
values at the boundary: `torch.topk` orders ties as it likes, so such data would not judge."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import kernel_standin


def load_official(inference_dir: Path) -> ModuleType:
    """The official model module from `inference_dir/model.py`, with the stand-in kernels."""
    path = inference_dir / "model.py"
    if not path.is_file():
        raise SystemExit(f"{path} not found: --official is the folder of DeepSeek's "
                         "inference/model.py")
    sys.modules["kernel"] = kernel_standin
    spec = importlib.util.spec_from_file_location("deepseek_v4_official_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def rotate_activation(x: torch.Tensor) -> torch.Tensor:
        return kernel_standin.hadamard_transform(x, scale=x.size(-1) ** -0.5)

    def get_logits(self: Any, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight)

    module.rotate_activation = rotate_activation  # type: ignore[attr-defined]
    module.ParallelHead.get_logits = get_logits
    return module


def build(module: ModuleType, args: dict[str, Any], *, device: str = "cpu",
          dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The official Transformer of `args` (ModelArgs fields), every linear a plain bf16
    `F.linear`; its parameters are uninitialised. In fp32 (the CPU reference) the whole module is
    cast to fp32; in bf16 it is built as the official `generate.py` builds it (default dtype
    bf16 on `device`: the norms, head, hyper-connections, sinks and compressors stay fp32)."""
    model_args = module.ModelArgs(dtype="bf16", expert_dtype=None, scale_dtype="fp8", **args)
    if dtype == torch.float32:
        torch.set_default_dtype(torch.float32)
        with torch.device(device):
            model: torch.nn.Module = module.Transformer(model_args).float().eval()
        return model
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = module.Transformer(model_args).eval()
    finally:
        torch.set_default_dtype(previous)
    return model


def model_args(config: dict[str, Any], *, max_seq_len: int,
               max_batch_size: int = 1) -> dict[str, Any]:
    """ModelArgs fields from a config.json in DeepSeek's keys (its HF repository's layout:
    `compress_ratios` one longer than the layers, for the MTP layer, which is left out)."""
    n = config["num_hidden_layers"]
    yarn = config.get("rope_scaling") or {}
    return dict(
        max_batch_size=max_batch_size, max_seq_len=max_seq_len, n_mtp_layers=0,
        vocab_size=config["vocab_size"], dim=config["hidden_size"],
        moe_inter_dim=config["moe_intermediate_size"], n_layers=n,
        n_hash_layers=config.get("num_hash_layers", 0),
        n_heads=config["num_attention_heads"], n_routed_experts=config["n_routed_experts"],
        n_shared_experts=config["n_shared_experts"],
        n_activated_experts=config["num_experts_per_tok"], score_func=config["scoring_func"],
        route_scale=config["routed_scaling_factor"], swiglu_limit=config["swiglu_limit"],
        q_lora_rank=config["q_lora_rank"], head_dim=config["head_dim"],
        rope_head_dim=config["qk_rope_head_dim"], norm_eps=config["rms_norm_eps"],
        o_groups=config["o_groups"], o_lora_rank=config["o_lora_rank"],
        window_size=config["sliding_window"],
        compress_ratios=tuple(config["compress_ratios"][:n]),
        compress_rope_theta=config["compress_rope_theta"],
        original_seq_len=yarn.get("original_max_position_embeddings", 0),
        rope_theta=config["rope_theta"], rope_factor=yarn.get("factor", 1),
        beta_fast=yarn.get("beta_fast", 32), beta_slow=yarn.get("beta_slow", 1),
        index_n_heads=config["index_n_heads"], index_head_dim=config["index_head_dim"],
        index_topk=config["index_topk"], hc_mult=config["hc_mult"],
        hc_sinkhorn_iters=config["hc_sinkhorn_iters"], hc_eps=config["hc_eps"])


def reset_state(model: torch.nn.Module) -> None:
    """Empty every cache and compressor state, so that a prompt does not see the last one's."""
    for name, buf in model.named_buffers():
        if name.endswith("score_state"):
            buf.fill_(float("-inf"))
        elif name.endswith(("kv_state", "kv_cache")):
            buf.zero_()


@dataclass
class Margins:
    """The smallest gaps seen, relative to the largest finite magnitude of their row: between
    the k-th and (k+1)-th values of each `topk` (both finite), and between the best and the
    second logit of each greedy pick."""

    topk: float = float("inf")
    greedy: float = float("inf")
    topk_calls: int = field(default=0)

    def see_topk(self, values: torch.Tensor, k: int) -> None:
        self.topk_calls += 1
        if k >= values.shape[-1]:
            return
        ordered = values.float().sort(dim=-1, descending=True).values
        kth, next_ = ordered[..., k - 1], ordered[..., k]
        finite = torch.isfinite(kth) & torch.isfinite(next_)
        if finite.any():
            size = values.float().masked_fill(~torch.isfinite(values), 0).abs().amax(-1)
            gap = (kth - next_)[finite] / size[finite].clamp(min=1e-30)
            self.topk = min(self.topk, gap.min().item())

    def see_logits(self, logits: torch.Tensor) -> None:
        top2 = logits.float().topk(2, dim=-1).values
        gap = (top2[..., 0] - top2[..., 1]) / logits.float().abs().amax(-1)
        self.greedy = min(self.greedy, gap.min().item())


@contextmanager
def watching_topk(margins: Margins) -> Iterator[None]:
    original = torch.Tensor.topk

    def topk(self: torch.Tensor, k: int, dim: int = -1, largest: bool = True,
             sorted: bool = True) -> Any:
        assert dim in (-1, self.dim() - 1) and largest
        margins.see_topk(self, k)
        return original(self, k, dim, largest, sorted)

    torch.Tensor.topk = topk  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.Tensor.topk = original  # type: ignore[method-assign]


@dataclass(frozen=True)
class Run:
    prefill_logits: torch.Tensor  # [T, vocab] fp32: at every prompt position
    greedy: torch.Tensor  # [N] int64: the greedy continuation
    decode_logits: torch.Tensor  # [N - 1, vocab] fp32: the decode steps' (the N-th token's
    # logits come from the prefill's last row)


@torch.inference_mode()
def run(model: torch.nn.Module, prompt: list[int], new_tokens: int, margins: Margins) -> Run:
    """Prefill `prompt` whole at position 0, then `new_tokens` greedy tokens, one a step."""
    reset_state(model)
    with watching_topk(margins):
        prefill = model(torch.tensor([prompt]), 0)[0]
        logits, tokens, steps = prefill[-1], [], []
        for step in range(new_tokens):
            margins.see_logits(logits)
            tokens.append(int(logits.argmax()))
            if step + 1 < new_tokens:
                logits = model(torch.tensor([[tokens[-1]]]), len(prompt) + step)[0, -1]
                steps.append(logits)
    return Run(prefill.float().clone(), torch.tensor(tokens),
               torch.stack(steps).float() if steps else prefill.new_zeros(0, prefill.shape[1]))


@torch.inference_mode()
def forced_logits(model: torch.nn.Module, tokens: list[int], prompt_len: int) -> torch.Tensor:
    """Teacher-forced logits [len(tokens) - 1, vocab] (fp32, on the model's device): the first
    `prompt_len` tokens prefilled at position 0 (a row per position), then each later token but
    the last decoded alone at its position (one row each): the official cache semantics, a
    call per `start_pos`, batch 1."""
    reset_state(model)
    device = next(model.parameters()).device
    with torch.device(device):
        rows = [model(torch.tensor([tokens[:prompt_len]]), 0)[0]]
        for pos in range(prompt_len, len(tokens) - 1):
            rows.append(model(torch.tensor([[tokens[pos]]]), pos)[0])
    return torch.cat(rows).float()
