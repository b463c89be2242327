"""The DeepSeek-V4 forward pass over a mixed batch of prefill chunks and decode tokens on the
paged cache of `kv_cache`: `reference.forward` with `paged_attention` in place of the
whole-sequence attention, batched over the step's requests. Its ops are its own (`kernels/`)
and openinfer-kernels' (Triton on the GPU, their plain-torch references on CPU); the weights
stay in FP8/FP4 on the GPU (`quantized.py`). Under tensor parallelism, one rank's shard
(`shard.py`): it meets the other ranks' in an all-reduce after the embedding, each attention
and each MoE (with expert parallelism each rank's own experts' part, `expert_parallel.py`),
and an all-gather of the logits. A
decode step's rows are pushed into the peers' memory (the group's push memory): a sublayer's
sum by its `hc_post` in the same launch (`kernels/mhc/push_post.py`), the embedding's by the
group's push all-reduce."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import torch

from openinfer_core.interfaces.kv import KVManager, KVStepLimits
from openinfer_core.interfaces.model import ForwardBatch, PushAreas, TensorParallelGroup
from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.kernels.mhc import (
    hc_head,
    hc_post,
    hc_post_all_reduce,
    hc_post_pre_all_reduce,
    hc_pre,
)
from openinfer_deepseek_v4.kernels.rotary import rope_table
from openinfer_deepseek_v4.kv_cache import (
    LayerCache,
    allocate_layers,
    full_bytes_per_block,
    group_bytes_per_block,
    kv_groups,
)
from openinfer_deepseek_v4.moe_forward import moe_forward
from openinfer_deepseek_v4.paged_attention import (
    INDEXER_SPLIT_TOKENS,
    Rope,
    indexer_split_tokens,
    paged_attention,
)
from openinfer_deepseek_v4.reference import (
    HyperConnectionWeights,
    ModelWeights,
    layer_freqs,
    project_logits,
)
from openinfer_deepseek_v4.shard import DeepseekV4Shard
from openinfer_deepseek_v4.shared_input import AttentionProducts, attention_products
from openinfer_deepseek_v4.side_branches import side_branches
from openinfer_deepseek_v4.step_slots import StepSlots
from openinfer_kernels.collective import (
    all_reduce_add_rms_norm,
    all_reduce_add_rms_norm_push,
    push_ids,
)
from openinfer_kernels.embed import embedding_part
from openinfer_kernels.sampling import SAMPLING_KERNELS
from openinfer_kvcache import GroupedKVManager, PagedKVManager, group_pool_blocks

# A/B switches, read when a model is built: "0" turns the stacked products (shared_input.py)
# or the all-reduce fused with hc_post (kernels/mhc/push_post.py) off.
STACK_ENV = "OPENINFER_DSV4_STACK"
PUSH_POST_ENV = "OPENINFER_DSV4_PUSH_POST"
# A one-token step's pushed hc_post and the next sublayer's hc_pre in one launch
# (kernels/mhc/push_post_pre.py): V4-Flash TP4 batch 1 on 4 x H200, 4.82 against 5.01 ms a
# token, the same logits bits at TP2 (`gpu_check.sh dsv4full`, tests/gpu). "0": two launches.
POST_PRE_ENV = "OPENINFER_DSV4_POST_PRE"
# N > 0: mixed steps of up to N tokens are captured in CUDA graphs too. A captured step's
# widths come from max_model_len (an HCA query's max_model_len / 128 entries, the indexer's
# max_model_len / 4 scores), so whether it beats the eager step is a measurement still to
# make: 0 (decode steps only) until then. tests/test_graph_contract.py checks the layout.
GRAPH_TOKENS_ENV = "OPENINFER_DSV4_GRAPH_TOKENS"


def graph_tokens() -> int:
    """`OPENINFER_DSV4_GRAPH_TOKENS`: the most tokens of a mixed step captured (0: none)."""
    value = os.environ.get(GRAPH_TOKENS_ENV, "0").strip()
    if not value.isdigit():
        raise ValueError(f"{GRAPH_TOKENS_ENV}={value!r}: a token count (0: decode steps only)")
    return int(value)


class DeepseekV4Model:
    """Weights and paged cache of one DeepSeek-V4 model on one device; with `tp`, of the
    rank's shard (`shard`; `self.cfg` stays the whole model's, `self.attn_cfg` has the rank's
    heads). Every rank keeps the whole KV cache (one KV head, replicated), in the KV groups of
    `kv_cache.kv_groups`: the compressed entries and indexer keys in the full group, the raw
    entries and the compressors' projections in window groups (none without compressed
    layers)."""

    def __init__(self, cfg: DeepseekV4Config, weights: ModelWeights, *, max_model_len: int,
                 device: torch.device, dtype: torch.dtype, tp: TensorParallelGroup | None = None,
                 shard: DeepseekV4Shard | None = None) -> None:
        if (tp is None) != (shard is None):
            raise ValueError("a tensor-parallel DeepseekV4Model needs both `tp` and `shard`")
        self.cfg = cfg
        self.attn_cfg = cfg if shard is None else shard.local_config(cfg)
        # Each attention's products of one input stacked by format, one launch a stack; its
        # weights then views of the stacks (shared_input.py). STACK_ENV=0: unstacked (A/B).
        stack = os.environ.get(STACK_ENV, "1") != "0"
        self._products: list[AttentionProducts] = []
        for i, layer in enumerate(weights.layers):
            products, attention = attention_products(layer.attention, stack)
            weights.layers[i] = dataclasses.replace(layer, attention=attention)
            self._products.append(products)
        self.w = weights
        self.tp = tp
        self.shard = shard
        self.vocab_size = cfg.vocab_size
        self.max_model_len = max_model_len
        self.device = device
        self.dtype = dtype
        self.layers: list[LayerCache] | None = None
        # SupportsKVGroups: the full group first, so `batch.block_tables` is its table.
        self.kv_groups = kv_groups(cfg)
        # Each layer's rotary, on the device once: its frequencies and the cos | sin of every
        # position (one table per kind of layer: window-only or compressed; max_model_len x
        # rope_head_dim values each, 128 MB apiece in bf16 at 1M positions).
        ropes: dict[bool, Rope] = {}
        for i in range(cfg.num_layers):
            freqs = layer_freqs(cfg, i).to(device)
            compressed = cfg.attention_kinds[i] != "window"
            if compressed not in ropes:
                ropes[compressed] = Rope(freqs, rope_table(freqs, max_model_len, dtype))
        self._ropes = [ropes[kind != "window"] for kind in cfg.attention_kinds]
        # Expert parallelism: the global ids of the experts this rank holds (None: every
        # rank holds a width slice of each).
        self._experts = None if shard is None or not shard.expert_parallel else shard.experts
        # Prompt steps from this many tokens split the indexer over the ranks (read once).
        self._indexer_split = INDEXER_SPLIT_TOKENS if tp is None else indexer_split_tokens()
        # The branches of a decode step on the side stream (read once; side_branches.py).
        self._side = side_branches()
        if tp is not None:
            # The group's push memory (on CUDA, where its mode asks for it): a decode step's
            # all-reduces, rows of the hidden width with the hyper-connections after them
            # rather than a norm, push their rows (the embedding's: the push kernel's sum-only
            # form).
            tp.enable_add_rms_norm(cfg.hidden_size, dtype, kernel=all_reduce_add_rms_norm,
                                   push_kernel=all_reduce_add_rms_norm_push, ids_kernel=push_ids)
        # The same memory for the sublayers' all-reduce fused with hc_post (kernels/mhc);
        # PUSH_POST_ENV=0: the all-reduce, then hc_post (A/B).
        self._push = (None if tp is None or os.environ.get(PUSH_POST_ENV, "1") == "0"
                      else tp.push_areas(cfg.hidden_size, dtype))
        self._post_pre = self._push is not None and os.environ.get(POST_PRE_ENV, "1") != "0"
        # Capabilities (interfaces.capabilities). CUDA graphs: a step syncs nothing with the
        # host and its widths follow `max_seq_len` (the graphs are captured with
        # max_model_len): capturable, decode steps only unless GRAPH_TOKENS_ENV says more;
        # under tensor and expert parallelism too (the collectives sit inside each rank's
        # graphs).
        self.cuda_graph_safe = device.type == "cuda"
        self.cuda_graph_max_tokens = graph_tokens()
        # The sampler's device kernels take any model's fp32 logits [B, V].
        self.sampling_kernels = SAMPLING_KERNELS
        # The experts a rank reads at batch 1: top_k slices of every expert, or with expert
        # parallelism top_k whole ones spread over the ranks (its share on average).
        self.weight_bytes = decode_weight_bytes(
            weights, cfg.top_k if self._experts is None
            else cfg.top_k * len(self._experts) / cfg.num_experts)
        # Not SupportsCompileAhead: its forward indexes with what its own kernels compute
        # (the indexer's top-k, the experts' routing), which a forward with the kernels'
        # launches skipped would leave unset; a cold start compiles on first launch instead.

    def kv_bytes_per_block(self, block_size: int) -> int:
        """One block of the full group (CSA entries and indexer keys) and the periodic
        groups' share per block (HCA entries)."""
        return full_bytes_per_block(self.cfg, block_size, self.dtype)

    def kv_window_bytes(self, block_size: int, limits: KVStepLimits) -> int:
        """The window pools, and the periodic groups' fixed part (a block per running request
        and the padding block, `periodic_pool_blocks`)."""
        pools = group_pool_blocks(self.kv_groups, 0, block_size, limits)
        per_block = group_bytes_per_block(self.cfg, block_size, self.dtype)
        return sum((n if not g.is_full else limits.max_num_seqs + 1) * b
                   for g, n, b in zip(self.kv_groups, pools, per_block, strict=True)
                   if not g.is_full or g.period > block_size)

    def create_kv_cache(self, num_blocks: int, block_size: int,
                        limits: KVStepLimits | None = None) -> KVManager:
        if num_blocks < 2:
            raise ValueError(f"a KV cache needs at least 2 blocks (one is padding), "
                             f"got {num_blocks}")
        pools = group_pool_blocks(self.kv_groups, num_blocks, block_size, limits)
        self.layers = allocate_layers(self.cfg, pools, block_size, self.dtype, self.device)
        if len(self.kv_groups) == 1:
            return PagedKVManager(num_blocks, block_size)
        return GroupedKVManager(self.kv_groups, pools, block_size)

    def kv_block_tensors(self) -> list[torch.Tensor]:
        """Layer-major: each layer's raw entries, then its compressors' projections and
        entries. Only with one KV group (no compressed layers); with window groups the
        offload tiers copy `kv_group_block_tensors()`."""
        if self.layers is None:
            raise RuntimeError("create_kv_cache() must run before kv_block_tensors()")
        if len(self.kv_groups) > 1:
            raise RuntimeError("kv_block_tensors(): DeepSeek-V4's KV is in window groups "
                               f"{[g.name for g in self.kv_groups[1:]]}: offload copies "
                               "kv_group_block_tensors()")
        return [t for layer in self.layers for t in layer.tensors()]

    def kv_group_block_tensors(self) -> tuple[list[torch.Tensor], ...]:
        """Per group, layer-major: each full group's compressed entries (the CSA entries and
        indexer keys in the first, each larger ratio's in its periodic group), and each window
        group's raw entries and compressor projections of the layers that keep them there."""
        if self.layers is None:
            raise RuntimeError("create_kv_cache() must run before kv_group_block_tensors()")
        out: tuple[list[torch.Tensor], ...] = tuple([] for _ in self.kv_groups)
        for layer in self.layers:
            out[layer.kv_group].append(layer.kv)
            for part in (layer.compressor, layer.indexer):
                if part is not None:
                    out[part.projection_group].append(part.projections)
                    out[part.entry_group].append(part.entries)
        return out

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if self.layers is None:
            raise RuntimeError("create_kv_cache() must run before forward()")
        cfg = self.cfg
        streams = self._embed(batch.input_ids).unsqueeze(1).expand(-1, cfg.hc_mult, -1)
        streams = streams.contiguous()
        slots = StepSlots(batch, self.layers[0].kv.shape[1])
        sublayers: list[tuple[HyperConnectionWeights, torch.Tensor,
                              Callable[[torch.Tensor], torch.Tensor]]] = []
        for i, (layer, cache) in enumerate(zip(self.w.layers, self.layers, strict=True)):
            attend = partial(paged_attention, w=layer.attention, products=self._products[i],
                             cfg=self.attn_cfg, layer=i, cache=cache, batch=batch,
                             rope=self._ropes[i], slots=slots, tp=self.tp,
                             split_tokens=self._indexer_split, side=self._side)
            ffn = partial(moe_forward, token_ids=batch.input_ids, w=layer.moe, cfg=cfg,
                          experts=self._experts, side=self._side)
            sublayers += [(layer.attn_hc, layer.attn_norm, attend),
                          (layer.ffn_hc, layer.ffn_norm, ffn)]
        pre = None  # the next sublayer's hc_pre, where the last hc_post's launch made it
        for k, (hc, norm, sublayer) in enumerate(sublayers):
            then = (sublayers[k + 1][:2] if self._post_pre and k + 1 < len(sublayers)
                    else None)
            streams, pre = _around(streams, hc, norm, sublayer, cfg, self.tp, self._push, pre,
                                   then)
        # Only the rows that sample need the head (none in a step of prefill chunks only; the
        # head's ops take no empty batch, and every rank skips the all-gather alike).
        rows = streams[batch.logits_indices]
        if rows.shape[0] == 0:
            return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.device)
        # The head's collapse and the last norm in one op (one launch at a token on the GPU).
        w = self.w.hc_head
        normed = hc_head(rows, w.fn, w.base, w.scale, hc_eps=cfg.hc_eps,
                         norm_eps=cfg.rms_norm_eps, norm_weight=self.w.norm)
        out = project_logits(normed, self.w)
        if self.tp is None:
            return out
        out = self.tp.all_gather(out)  # [S, size * padded part]: the vocabulary, padded
        return out if out.shape[1] == self.vocab_size else out[:, :self.vocab_size].contiguous()

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[T, H]: under tensor parallelism each rank looks up the ids of its vocabulary part
        (zero rows for the others) and the sum over ranks is the lookup."""
        if self.tp is None or self.shard is None:
            return self.w.embed[token_ids]
        return self.tp.all_reduce(embedding_part(token_ids, self.w.embed,
                                                 self.shard.vocab.rows.start))


def decode_weight_bytes(w: ModelWeights, top_k: float) -> int:
    """Bytes of weights a batch-1 decode step reads (the benchmarks' floor): every weight
    but the embedding table (one row of it) and the routed experts (`top_k` of each layer's
    held ones, a mean where it is not whole), in the formats they are held in."""
    total = w.embed[0].numel() * w.embed.element_size()
    for layer in w.layers:
        experts = [e for e in (layer.moe.gate_up, layer.moe.down) if e is not None]
        total += round(top_k * sum(t[0].numel() * t.element_size()
                                   for e in experts for t in _tensors(e)))
        total += sum(t.numel() * t.element_size() for t in _tensors(layer, skip=experts)
                     if t.is_floating_point() or t.element_size() == 1)
    return total + sum(t.numel() * t.element_size()
                       for t in _tensors(w, skip=[w.embed, *w.layers]))


def _tensors(obj: object, skip: Sequence[object] | None = None) -> Iterator[torch.Tensor]:
    """The tensors in a tree of weight dataclasses, leaving out the subtrees in `skip`."""
    if skip is not None and any(obj is s for s in skip):
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list):
        for item in obj:
            yield from _tensors(item, skip)
    elif dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, field.name), skip)


def _around(streams: torch.Tensor, hc: HyperConnectionWeights, norm: torch.Tensor,
            sublayer: Callable[[torch.Tensor], torch.Tensor], cfg: DeepseekV4Config,
            tp: TensorParallelGroup | None = None, push: PushAreas | None = None,
            pre: tuple[torch.Tensor, ...] | None = None,
            then: tuple[HyperConnectionWeights, torch.Tensor] | None = None
            ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """`reference.around` in two ops (Triton kernels on the GPU): the mixing weights, collapse
    and norm before the sublayer, the expansion after: (new streams, None). With `tp` the
    sublayer's output is this rank's partial sum: summed over the ranks by the expansion itself
    where the group's push memory takes the rows (`hc_post_all_reduce`), else by the group's
    all-reduce first. `pre`: hc_pre's (x, post, comb's logits), made already; `then`: the next
    sublayer's (hc, norm), whose hc_pre the expansion's launch also makes where it can
    (`hc_post_pre_all_reduce`, one token): (new streams, that hc_pre's outputs)."""
    # comb's Sinkhorn-Knopp runs in hc_post (kernels/mhc/triton.py says why)
    x, post, comb_logits = pre if pre is not None else hc_pre(
        streams, hc.fn, hc.base, hc.scale, norm, hc_eps=cfg.hc_eps, norm_eps=cfg.rms_norm_eps)
    out = sublayer(x)
    eps, iters = cfg.hc_eps, cfg.hc_sinkhorn_iters
    if tp is None:
        return hc_post(streams, out, post, comb_logits, hc_eps=eps, sinkhorn_iters=iters), None
    if then is not None:
        both = hc_post_pre_all_reduce(streams, out, post, comb_logits, push, then[0].fn,
                                      then[0].base, then[0].scale, then[1], hc_eps=eps,
                                      sinkhorn_iters=iters, norm_eps=cfg.rms_norm_eps)
        if both is not None:
            return both[0], both[1:]
    fused = hc_post_all_reduce(streams, out, post, comb_logits, push, hc_eps=eps,
                               sinkhorn_iters=iters)
    return (fused if fused is not None
            else hc_post(streams, tp.all_reduce(out), post, comb_logits, hc_eps=eps,
                         sinkhorn_iters=iters)), None
