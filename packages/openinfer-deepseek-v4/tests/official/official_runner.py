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


def build(module: ModuleType, args: dict[str, Any]) -> torch.nn.Module:
    """The official Transformer of `args` (ModelArgs fields), every linear a plain bf16
    `F.linear`, cast to fp32; its parameters are uninitialised."""
    model_args = module.ModelArgs(dtype="bf16", expert_dtype=None, scale_dtype="fp8", **args)
    torch.set_default_dtype(torch.float32)
    model: torch.nn.Module = module.Transformer(model_args).float().eval()
    return model


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
