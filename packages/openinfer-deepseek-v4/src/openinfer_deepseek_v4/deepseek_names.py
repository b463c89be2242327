"""`reference.ModelWeights` from a state dict in DeepSeek's own names, as its HF repository
ships them (spec: shared deepseek-v4.md §11.1): FP8 weights with 128 x 128 block scales, FP4
routed experts with per-32 scales, the rest bf16/fp32. Quantized weights are dequantized to
`dtype` here (the reference path); the tensors the spec keeps in fp32 (hyper-connections,
sinks, compressor position biases, router biases) stay fp32. MTP tensors (`mtp.*`) are not
used. transformers' `save_pretrained` writes these names too, behind a `model.` prefix and with
its own names for the embedding, the head and its hyper-connection (accepted here)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import torch
import torch.nn.functional as F

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.quantized import Fp4Experts
from openinfer_deepseek_v4.reference import (
    AttentionWeights,
    CompressorWeights,
    HyperConnectionWeights,
    IndexerWeights,
    LayerWeights,
    ModelWeights,
    MoEWeights,
)
from openinfer_deepseek_v4.shard import DeepseekV4Shard
from openinfer_deepseek_v4.tensor_reader import Cut, TensorReader, stored_part, stored_shape

# transformers' save_pretrained names (after the `model.` prefix) -> DeepSeek's. (Reversing
# its compressor's `norm` -> `kv_norm` rename also renames the attention's own `kv_norm`.)
_ALIASES = {"embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
            "hc_head.hc_fn": "hc_head_fn", "hc_head.hc_base": "hc_head_base",
            "hc_head.hc_scale": "hc_head_scale"}
_ATTN_NORM = re.compile(r"(layers\.\d+\.attn)\.norm\.weight")


def canonical_name(name: str) -> str:
    name = name.removeprefix("model.")
    return _ATTN_NORM.sub(r"\1.kv_norm.weight", _ALIASES.get(name, name))


def keeps_fp32(name: str) -> bool:
    """Whether the spec keeps tensor `name` (DeepSeek's names) in fp32 (§10.1)."""
    last = name.rsplit(".", 1)[-1]
    return (last.startswith("hc_") or last in ("attn_sink", "ape")
            or name.endswith("gate.bias"))


class _Canonical(Mapping[str, torch.Tensor]):
    """A state dict seen through `canonical_name`, read lazily."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self._state = state
        self._names = {canonical_name(k): k for k in state}

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._state[self._names[name]]

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def part(self, name: str, dim: int, part: range) -> torch.Tensor:
        return stored_part(self._state, self._names[name], dim, part)

    def shape(self, name: str) -> tuple[int, ...]:
        return stored_shape(self._state, self._names[name])


def deepseek_shapes(cfg: DeepseekV4Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the model reads, in DeepSeek's names, at its dequantized shape."""
    h, n, heads, d = cfg.hidden_size, cfg.hc_mult, cfg.num_heads, cfg.head_dim
    inter, shared = cfg.moe_intermediate_size, cfg.moe_intermediate_size * cfg.num_shared_experts
    shapes: dict[str, tuple[int, ...]] = {
        "embed.weight": (cfg.vocab_size, h), "head.weight": (cfg.vocab_size, h),
        "norm.weight": (h,), "hc_head_fn": (n, n * h), "hc_head_base": (n,),
        "hc_head_scale": (1,)}
    for i, kind in enumerate(cfg.attention_kinds):
        p, a, f = f"layers.{i}", f"layers.{i}.attn", f"layers.{i}.ffn"
        shapes |= {f"{p}.attn_norm.weight": (h,), f"{p}.ffn_norm.weight": (h,)}
        for sub in ("attn", "ffn"):
            shapes |= {f"{p}.hc_{sub}_fn": ((2 + n) * n, n * h),
                       f"{p}.hc_{sub}_base": ((2 + n) * n,), f"{p}.hc_{sub}_scale": (3,)}
        shapes |= {
            f"{a}.attn_sink": (heads,), f"{a}.q_norm.weight": (cfg.q_lora_rank,),
            f"{a}.kv_norm.weight": (d,), f"{a}.wq_a.weight": (cfg.q_lora_rank, h),
            f"{a}.wq_b.weight": (heads * d, cfg.q_lora_rank), f"{a}.wkv.weight": (d, h),
            f"{a}.wo_a.weight": (cfg.o_groups * cfg.o_lora_rank, heads * d // cfg.o_groups),
            f"{a}.wo_b.weight": (h, cfg.o_groups * cfg.o_lora_rank)}
        compressors = {} if kind == "window" else {f"{a}.compressor": d}
        if kind == "csa":
            compressors[f"{a}.indexer.compressor"] = cfg.index_head_dim
            shapes |= {f"{a}.indexer.wq_b.weight": (cfg.index_n_heads * cfg.index_head_dim,
                                                    cfg.q_lora_rank),
                       f"{a}.indexer.weights_proj.weight": (cfg.index_n_heads, h)}
        for c, width in compressors.items():
            halves = 2 if kind == "csa" else 1
            ratio = cfg.compress_ratios[i]
            shapes |= {f"{c}.ape": (ratio, halves * width),
                       f"{c}.wkv.weight": (halves * width, h),
                       f"{c}.wgate.weight": (halves * width, h), f"{c}.norm.weight": (width,)}
        shapes[f"{f}.gate.weight"] = (cfg.num_experts, h)
        if cfg.hash_layers[i]:
            shapes[f"{f}.gate.tid2eid"] = (cfg.vocab_size, cfg.top_k)
        else:
            shapes[f"{f}.gate.bias"] = (cfg.num_experts,)
        for prefix, size in [(f"{f}.experts.{e}", inter) for e in range(cfg.num_experts)] + [
                (f"{f}.shared_experts", shared)]:
            shapes |= {f"{prefix}.w1.weight": (size, h), f"{prefix}.w3.weight": (size, h),
                       f"{prefix}.w2.weight": (h, size)}
    return shapes


def weights_from_deepseek(state: Mapping[str, torch.Tensor], cfg: DeepseekV4Config,
                          dtype: torch.dtype = torch.bfloat16, *, keep_quantized: bool = False,
                          shard: DeepseekV4Shard | None = None) -> ModelWeights:
    """Errors (`WeightLoadError`) name a missing or mis-shaped tensor. With `keep_quantized`,
    FP8 linears and FP4 routed experts stay in their formats (`quantized.Fp8Linear`,
    `quantized.Fp4Experts`), for the kernels that dequantize in registers. With `shard`, only
    that tensor-parallel rank's slices and experts (`shard.DeepseekV4Shard`); the embedding
    and head get zero rows up to `shard.vocab.padded`."""
    r = TensorReader(_Canonical(state), deepseek_shapes(cfg), dtype, keep_quantized, keeps_fp32)
    shard = shard or DeepseekV4Shard.of(cfg)
    get, weight = r.get, r.weight
    d, lora = cfg.head_dim, cfg.o_lora_rank
    heads = Cut(0, shard.heads)
    q_rows = Cut(0, range(shard.heads.start * d, shard.heads.stop * d))
    groups = range(shard.groups.start * lora, shard.groups.stop * lora)

    def experts(f: str) -> tuple[torch.Tensor | Fp4Experts, torch.Tensor | None]:
        rows, cols = Cut(0, shard.intermediate), Cut(1, shard.intermediate)
        names = [f"{f}.experts.{e}" for e in shard.experts]
        packed = _fp4_experts(r, names, rows, cols) if keep_quantized else None
        if packed is not None:
            return packed, None
        return (torch.stack([torch.cat([get(f"{e}.w1.weight", rows), get(f"{e}.w3.weight", rows)])
                             for e in names]),
                torch.stack([get(f"{e}.w2.weight", cols) for e in names]))

    def vocab(name: str) -> torch.Tensor:
        rows = get(name, Cut(0, shard.vocab.rows))
        return F.pad(rows, (0, 0, 0, shard.vocab.padded - rows.shape[0]))

    def hc(prefix: str) -> HyperConnectionWeights:
        return HyperConnectionWeights(get(f"{prefix}_fn"), get(f"{prefix}_base"),
                                      get(f"{prefix}_scale"))

    def compressor(prefix: str) -> CompressorWeights:
        return CompressorWeights(get(f"{prefix}.wkv.weight"), get(f"{prefix}.wgate.weight"),
                                 get(f"{prefix}.ape"), get(f"{prefix}.norm.weight"))

    layers = []
    for i, kind in enumerate(cfg.attention_kinds):
        a, f = f"layers.{i}.attn", f"layers.{i}.ffn"
        attention = AttentionWeights(
            q_a=weight(f"{a}.wq_a.weight"), q_a_norm=get(f"{a}.q_norm.weight"),
            q_b=weight(f"{a}.wq_b.weight", cut=q_rows), kv=weight(f"{a}.wkv.weight"),
            kv_norm=get(f"{a}.kv_norm.weight"),
            o_a=weight(f"{a}.wo_a.weight", cut=Cut(0, groups)),
            o_b=weight(f"{a}.wo_b.weight", cut=Cut(1, groups)),
            sinks=get(f"{a}.attn_sink", heads),
            compressor=None if kind == "window" else compressor(f"{a}.compressor"),
            indexer=None if kind != "csa" else IndexerWeights(
                compressor(f"{a}.indexer.compressor"), weight(f"{a}.indexer.wq_b.weight"),
                get(f"{a}.indexer.weights_proj.weight")))
        gate_up, down = experts(f)
        moe = MoEWeights(
            gate=get(f"{f}.gate.weight"),
            bias=None if cfg.hash_layers[i] else get(f"{f}.gate.bias"),
            tid2eid=get(f"{f}.gate.tid2eid") if cfg.hash_layers[i] else None,
            gate_up=gate_up, down=down,
            shared_gate_up=weight(f"{f}.shared_experts.w1.weight",
                                  f"{f}.shared_experts.w3.weight", cut=Cut(0, shard.shared)),
            shared_down=weight(f"{f}.shared_experts.w2.weight", cut=Cut(1, shard.shared)))
        layers.append(LayerWeights(hc(f"layers.{i}.hc_attn"), get(f"layers.{i}.attn_norm.weight"),
                                   attention, hc(f"layers.{i}.hc_ffn"),
                                   get(f"layers.{i}.ffn_norm.weight"), moe))
    return ModelWeights(embed=vocab("embed.weight"), layers=layers, hc_head=hc("hc_head"),
                        norm=get("norm.weight"), lm_head=vocab("head.weight"))


def _fp4_experts(r: TensorReader, experts: list[str], rows: Cut,
                 cols: Cut) -> Fp4Experts | None:
    """`experts` (their `rows` of w1 and w3, `cols` of w2) stacked in FP4; None when they are
    not all FP4 or the cut splits the scale groups."""
    packed: dict[str, list[torch.Tensor]] = {"w": [], "s": [], "dw": [], "ds": []}
    for e in experts:
        for key, names, cut in (("", ("w1", "w3"), rows), ("d", ("w2",), cols)):
            pairs = [r.fp4(f"{e}.{n}.weight", cut) for n in names]
            if any(p is None for p in pairs):
                return None
            packed[key + "w"].append(torch.cat([p[0] for p in pairs if p is not None]))
            packed[key + "s"].append(torch.cat([p[1] for p in pairs if p is not None]))
    return Fp4Experts(*(torch.stack(packed[k]) for k in ("w", "s", "dw", "ds")))
