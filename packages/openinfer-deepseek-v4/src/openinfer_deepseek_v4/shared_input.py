"""Products of one input by several weights, one launch per format: an attention sublayer
multiplies its input x by up to seven weights (the q lora, the raw entry, each compressor's
kv and gate, the indexer's head weights) and the q lora's output by two (the heads' queries,
the indexer's). At load the weights of one format (FP8 blocks of one input width, or plain
tensors of one dtype) are stacked row-wise into one weight, and each original becomes a view
of its rows, so nothing is held twice; a step then runs one product per stack and cuts its
columns back into each product's (views with the stack's row stride, which the kernels that
read them take). At batch 1 every product is a launch of a few microseconds that reads a few
MB: fewer launches, the same bytes.

The stacked product is the same math as the separate ones; on the GPU its tile (and so its
fp32 summation order) may differ, as for any other shape."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from openinfer_deepseek_v4.quantized import BLOCK, Fp8Linear, Weight, linear
from openinfer_deepseek_v4.reference import AttentionWeights


@dataclass(frozen=True, slots=True)
class SharedInput:
    """The stacks of one input's products: each (weight, its products' names, their widths)."""

    stacks: tuple[tuple[Weight, tuple[str, ...], tuple[int, ...]], ...]

    def __call__(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every product of x [T, I], by name: [T, O] each (column views of its stack's)."""
        out: dict[str, torch.Tensor] = {}
        for weight, names, widths in self.stacks:
            product = linear(x, weight)
            out.update(zip(names, product.split(widths, dim=-1), strict=True))
        return out

    @property
    def launches(self) -> int:
        return len(self.stacks)


def _kind(w: Weight) -> tuple[object, ...] | None:
    """What a weight stacks with (None: alone): FP8 of whole scale blocks of rows and the same
    input width, or plain tensors of one dtype, input width and device."""
    if isinstance(w, Fp8Linear):
        if w.weight.shape[0] % BLOCK:
            return None
        return ("fp8", w.weight.shape[1], w.scale.shape[1], w.scale.dtype, w.weight.device)
    return ("plain", w.dtype, w.shape[1], w.device)


def _stacked(weights: list[Weight]) -> tuple[Weight, list[Weight]]:
    """One weight of `weights`' rows in order, and each of them as a view of its rows."""
    if len(weights) == 1:
        return weights[0], weights
    if isinstance(weights[0], Fp8Linear):
        fp8 = [w for w in weights if isinstance(w, Fp8Linear)]
        stack = Fp8Linear(torch.cat([w.weight for w in fp8]), torch.cat([w.scale for w in fp8]))
        views: list[Weight] = []
        row = 0
        for w in fp8:
            rows = w.weight.shape[0]
            views.append(Fp8Linear(stack.weight[row:row + rows],
                                   stack.scale[row // BLOCK:(row + rows) // BLOCK]))
            row += rows
        return stack, views
    plain = [w for w in weights if isinstance(w, torch.Tensor)]
    whole = torch.cat(plain)
    return whole, list(whole.split([w.shape[0] for w in plain]))


def shared_input(weights: Mapping[str, Weight],
                 stack: bool = True) -> tuple[SharedInput, dict[str, Weight]]:
    """The stacks of `weights` (products of one input, by name; stacked by `_kind`, in the
    mapping's order), and each weight as a view of its stack: to put in place of the original,
    which is then no longer held. `stack` False: each weight a stack of its own (an A/B)."""
    groups: dict[object, list[str]] = {}
    for name, w in weights.items():
        kind = _kind(w) if stack else None
        groups.setdefault(kind if kind is not None else ("alone", name), []).append(name)
    stacks = []
    views: dict[str, Weight] = {}
    for names in groups.values():
        stacked, parts = _stacked([weights[n] for n in names])
        views.update(zip(names, parts, strict=True))
        stacks.append((stacked, tuple(names), tuple(_rows(p) for p in parts)))
    return SharedInput(tuple(stacks)), views


def _rows(w: Weight) -> int:
    return w.weight.shape[0] if isinstance(w, Fp8Linear) else w.shape[0]


@dataclass(frozen=True, slots=True)
class AttentionProducts:
    """An attention sublayer's products, stacked: of its input x ("q_a", "kv", and where the
    layer has them "compressor.kv", "compressor.gate", "indexer.kv", "indexer.gate",
    "indexer.weights"), and of the q lora's normed output ("q_b", "indexer.q_b")."""

    of_x: SharedInput
    of_q: SharedInput


def attention_products(w: AttentionWeights,
                       stack: bool = True) -> tuple[AttentionProducts, AttentionWeights]:
    """The layer's stacked products, and its weights with each stacked one a view of its
    stack (`shared_input`; `stack` False: none stacked)."""
    of_x: dict[str, Weight] = {"q_a": w.q_a, "kv": w.kv}
    of_q: dict[str, Weight] = {"q_b": w.q_b}
    if w.compressor is not None:
        of_x |= {"compressor.kv": w.compressor.kv, "compressor.gate": w.compressor.gate}
    if w.indexer is not None:
        c = w.indexer.compressor
        of_x |= {"indexer.kv": c.kv, "indexer.gate": c.gate,
                 "indexer.weights": w.indexer.weights_proj}
        of_q["indexer.q_b"] = w.indexer.q_b
    x_stacks, x_views = shared_input(of_x, stack)
    q_stacks, q_views = shared_input(of_q, stack)
    compressor = indexer = None
    if w.compressor is not None:
        compressor = replace(w.compressor, kv=_plain(x_views["compressor.kv"]),
                             gate=_plain(x_views["compressor.gate"]))
    if w.indexer is not None:
        indexer = replace(
            w.indexer, q_b=q_views["indexer.q_b"], weights_proj=_plain(x_views["indexer.weights"]),
            compressor=replace(w.indexer.compressor, kv=_plain(x_views["indexer.kv"]),
                               gate=_plain(x_views["indexer.gate"])))
    return AttentionProducts(x_stacks, q_stacks), replace(
        w, q_a=x_views["q_a"], kv=x_views["kv"], q_b=q_views["q_b"], compressor=compressor,
        indexer=indexer)


def _plain(w: Weight) -> torch.Tensor:
    assert isinstance(w, torch.Tensor)  # stacked with plain tensors only
    return w
