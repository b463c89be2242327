"""The DeepSeek-V4 reference ops (`kernels/mhc/`, `kernels/moe/`, ...) against the modules of
transformers' `DeepseekV4ForCausalLM` they replace, in fp32 at a tiny config."""

from __future__ import annotations

import pytest
import torch

from openinfer_deepseek_v4.kernels.compress import compress_kv_ref
from openinfer_deepseek_v4.kernels.indexer import indexer_scores_ref, indexer_topk_ref
from openinfer_deepseek_v4.kernels.mhc import (
    hc_collapse_ref,
    hc_expand_ref,
    hc_head_ref,
    hc_weights_ref,
)
from openinfer_deepseek_v4.kernels.moe import (
    moe_experts_ref,
    route_hash_ref,
    route_topk_ref,
    swiglu_clamped_ref,
)
from openinfer_deepseek_v4.kernels.rotary import rope_frequencies, rotary_interleaved_ref
from openinfer_deepseek_v4.kernels.sparse_attention import sink_attention_ref
from openinfer_kernels.gemm import grouped_linear_ref

tf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
TOL = dict(rtol=1e-5, atol=1e-5)


def _randomise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


def _streams(config, tokens: int = 5) -> torch.Tensor:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(7)
    return torch.randn(1, tokens, config.hc_mult, config.hidden_size, generator=g)


def test_hyper_connection_weights_collapse_and_expand(config) -> None:  # type: ignore[no-untyped-def]
    hc = _randomise(tf.DeepseekV4HyperConnection(config), 1)
    streams = _streams(config)
    post, comb, collapsed = hc(streams)
    pre, our_post, our_comb = hc_weights_ref(
        streams[0], hc.fn, hc.base, hc.scale, hc_eps=config.hc_eps,
        norm_eps=config.rms_norm_eps, sinkhorn_iters=config.hc_sinkhorn_iters)
    torch.testing.assert_close(our_post, post[0], **TOL)
    torch.testing.assert_close(our_comb, comb[0], **TOL)
    torch.testing.assert_close(hc_collapse_ref(streams[0], pre), collapsed[0], **TOL)
    # Sinkhorn ends on a column pass: each column of comb sums to 1 (up to hc_eps); the
    # expansion sums over comb's first index
    torch.testing.assert_close(our_comb.sum(-2), torch.ones(5, 4), rtol=0, atol=1e-4)
    out = torch.randn(5, config.hidden_size)
    want = (our_post[..., None] * out[:, None, :]
            + torch.einsum("tjk,tjd->tkd", our_comb, streams[0]))
    torch.testing.assert_close(hc_expand_ref(streams[0], out, our_post, our_comb), want, **TOL)


def test_hyper_head(config) -> None:  # type: ignore[no-untyped-def]
    head = _randomise(tf.DeepseekV4HyperHead(config), 2)
    streams = _streams(config)
    ours = hc_head_ref(streams[0], head.hc_fn, head.hc_base, head.hc_scale,
                       hc_eps=config.hc_eps, norm_eps=config.rms_norm_eps)
    torch.testing.assert_close(ours, head(streams)[0], **TOL)


def _same_picks(ours: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                ids: torch.Tensor) -> None:
    """Same experts with the same weights, in any order."""
    our_w, our_ids = ours
    a, b = our_ids.sort(dim=-1), ids.sort(dim=-1)
    assert torch.equal(a.values, b.values)
    torch.testing.assert_close(our_w.gather(1, a.indices), weights.gather(1, b.indices), **TOL)


def test_score_routing(config) -> None:  # type: ignore[no-untyped-def]
    router = _randomise(tf.DeepseekV4TopKRouter(config), 3)
    router.e_score_correction_bias.copy_(torch.randn(config.n_routed_experts))
    x = torch.randn(6, config.hidden_size)
    logits, weights, ids = router(x)
    _same_picks(route_topk_ref(logits, router.e_score_correction_bias,
                               config.num_experts_per_tok, config.routed_scaling_factor),
                weights, ids)


def test_hash_routing(config) -> None:  # type: ignore[no-untyped-def]
    router = _randomise(tf.DeepseekV4HashRouter(config), 4)
    g = torch.Generator().manual_seed(4)
    router.tid2eid.copy_(torch.stack([torch.randperm(config.n_routed_experts, generator=g)[
        :config.num_experts_per_tok] for _ in range(config.vocab_size)]))
    x, token_ids = torch.randn(6, config.hidden_size), torch.tensor([0, 5, 5, 63, 17, 2])
    logits, weights, ids = router(x, token_ids)
    _same_picks(route_hash_ref(logits, router.tid2eid, token_ids,
                               config.routed_scaling_factor), weights, ids)


def test_moe_block_routed_and_shared(config) -> None:  # type: ignore[no-untyped-def]
    block = _randomise(tf.DeepseekV4SparseMoeBlock(config, layer_idx=1), 5)  # a score layer
    block.gate.e_score_correction_bias.copy_(torch.randn(config.n_routed_experts))
    x = torch.randn(1, 9, config.hidden_size)
    flat = x[0]
    weights, ids = route_topk_ref(flat @ block.gate.weight.t(), block.gate.e_score_correction_bias,
                                  config.num_experts_per_tok, config.routed_scaling_factor)
    routed = moe_experts_ref(flat, ids, weights, block.experts.gate_up_proj,
                             block.experts.down_proj, config.swiglu_limit)
    shared = block.shared_experts
    gate_up = torch.cat([shared.gate_proj.weight, shared.up_proj.weight])
    shared_out = swiglu_clamped_ref(flat @ gate_up.t(), config.swiglu_limit) \
        @ shared.down_proj.weight.t()
    with torch.no_grad():
        torch.testing.assert_close(routed + shared_out, block(x)[0], **TOL)
    assert (flat @ gate_up.t()).abs().max() > config.swiglu_limit  # the clamps are exercised


@pytest.mark.parametrize("kind", ["main", "compress"])
def test_rotary_tables_and_rotation(config, kind: str) -> None:  # type: ignore[no-untyped-def]
    """The frequencies of both rotary kinds (plain, and YaRN for the compressed layers) and the
    interleaved rotation of a head's trailing dims, forward and back."""
    rope = tf.DeepseekV4RotaryEmbedding(config)
    params = config.rope_parameters[kind]
    rope_dim = config.qk_rope_head_dim
    yarn = params.get("rope_type") == "yarn"
    freqs = rope_frequencies(
        rope_dim, params["rope_theta"], yarn_factor=params.get("factor", 1.0) if yarn else 1.0,
        original_max_positions=params.get("original_max_position_embeddings", 0),
        beta_fast=params.get("beta_fast", 32.0), beta_slow=params.get("beta_slow", 1.0))
    assert yarn == (kind == "compress")
    torch.testing.assert_close(freqs, getattr(rope, f"{kind}_inv_freq"), rtol=1e-6, atol=0)
    positions = torch.tensor([0, 1, 7, 300, 70000])
    x = torch.randn(5, 2, config.head_dim)
    cos, sin = rope(x, positions[None], layer_type=kind)
    want = tf.apply_rotary_pos_emb(x.transpose(0, 1)[None], cos, sin)[0].transpose(0, 1)
    ours = rotary_interleaved_ref(x, positions, freqs)
    torch.testing.assert_close(ours, want, **TOL)
    torch.testing.assert_close(rotary_interleaved_ref(ours, positions, freqs, inverse=True), x,
                               rtol=1e-4, atol=1e-4)


def test_yarn_bounds_of_the_published_config() -> None:
    """Spec §13: rotary dim 64, theta 160000, factor 16 over 65536 positions blends pairs 15..25:
    the faster ones keep their frequency, the slower ones are divided by 16."""
    plain = rope_frequencies(64, 160000.0)
    yarn = rope_frequencies(64, 160000.0, yarn_factor=16, original_max_positions=65536)
    assert torch.equal(yarn[:16], plain[:16])
    torch.testing.assert_close(yarn[25:], plain[25:] / 16, rtol=1e-6, atol=0)
    assert bool(((yarn[16:25] < plain[16:25]) & (yarn[16:25] > plain[16:25] / 16)).all())


def _compress_freqs(config) -> torch.Tensor:  # type: ignore[no-untyped-def]
    p = config.rope_parameters["compress"]
    return rope_frequencies(config.qk_rope_head_dim, p["rope_theta"], yarn_factor=p["factor"],
                            original_max_positions=p["original_max_position_embeddings"])


@pytest.mark.parametrize(("kind", "tokens"), [("hca", 8 * 5 + 3), ("csa", 4 * 6 + 1),
                                               ("csa", 3)])
def test_compressor(config, kind: str, tokens: int) -> None:  # type: ignore[no-untyped-def]
    """Whole-sequence compression (transformers' stateless mode): HCA pools each window, CSA
    pools overlapping pairs of windows; a trailing partial window gives no entry."""
    cls = tf.DeepseekV4HCACompressor if kind == "hca" else tf.DeepseekV4CSACompressor
    comp = _randomise(cls(config), 6)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1, tokens, config.hidden_size, generator=g)
    q_residual = torch.randn(1, tokens, config.q_lora_rank, generator=g)
    with torch.no_grad():
        want = comp(x, q_residual, torch.arange(tokens)[None], None, 0)[0][0, 0]
        ours = compress_kv_ref(x[0] @ comp.kv_proj.weight.t(), x[0] @ comp.gate_proj.weight.t(),
                               comp.position_bias, comp.kv_norm.weight, _compress_freqs(config),
                               ratio=comp.compress_rate, overlap=kind == "csa",
                               norm_eps=config.rms_norm_eps)
    assert ours.shape == (tokens // comp.compress_rate, config.head_dim) == want.shape
    torch.testing.assert_close(ours, want, **TOL)


@pytest.mark.parametrize("tokens", [3, 4 * 9 + 2])
def test_indexer_picks(config, tokens: int) -> None:  # type: ignore[no-untyped-def]
    """The indexer's own compressor, its rotated queries, its scores and its causal top-k,
    against transformers' indexer in stateless mode (picks compared as sets per query)."""
    idx = _randomise(tf.DeepseekV4Indexer(config), 9)
    g = torch.Generator().manual_seed(10)
    x = torch.randn(1, tokens, config.hidden_size, generator=g)
    q_residual = torch.randn(1, tokens, config.q_lora_rank, generator=g)
    positions = torch.arange(tokens)
    freqs = _compress_freqs(config)
    with torch.no_grad():
        want = idx(x, q_residual, positions[None], None, 0)[0]
        keys = compress_kv_ref(x[0] @ idx.kv_proj.weight.t(), x[0] @ idx.gate_proj.weight.t(),
                               idx.position_bias, idx.kv_norm.weight, freqs, ratio=4,
                               overlap=True, norm_eps=config.rms_norm_eps)
        q = (q_residual[0] @ idx.q_b_proj.weight.t()).view(tokens, -1, idx.head_dim)
        q = rotary_interleaved_ref(q, positions, freqs)
        scores = indexer_scores_ref(q, keys, x[0] @ idx.scorer.weights_proj.weight.t(),
                                    softmax_scale=idx.scorer.softmax_scale,
                                    weights_scale=idx.scorer.weights_scaling)
        ours = indexer_topk_ref(scores, positions, ratio=4, top_k=config.index_topk)
    assert ours.shape == want.shape
    assert torch.equal(ours.sort(dim=-1).values, want.sort(dim=-1).values)
    if tokens > 8:
        assert (ours >= 0).sum() > tokens and (ours == -1).any()  # picks made, and refused


def test_sink_attention(config) -> None:  # type: ignore[no-untyped-def]
    """Over a per-query key set with some keys masked out, against transformers' eager
    attention with sinks (one KV head shared by every query head)."""
    g = torch.Generator().manual_seed(11)
    t, k, h, d = 5, 7, config.num_attention_heads, config.head_dim
    q, kv = torch.randn(t, h, d, generator=g), torch.randn(k, d, generator=g)
    valid = torch.rand(t, k, generator=g) > 0.3
    valid[0] = False  # a query that sees nothing attends to the sink alone: output 0
    sinks = torch.randn(h, generator=g)
    module = torch.nn.Module()
    module.sinks, module.num_key_value_groups, module.training = sinks, h, False
    mask = torch.zeros(t, k).masked_fill(~valid, float("-inf"))[None, None]
    want, _ = tf.eager_attention_forward(module, q.transpose(0, 1)[None], kv[None, None],
                                         kv[None, None], mask, d ** -0.5)
    ours = sink_attention_ref(q, kv.expand(t, k, d), valid, sinks, d ** -0.5)
    torch.testing.assert_close(ours, want[0], **TOL)
    assert torch.equal(ours[0], torch.zeros(h, d))


def test_grouped_output_projection(config) -> None:  # type: ignore[no-untyped-def]
    heads_dim = config.num_attention_heads * config.head_dim
    layer = _randomise(tf.DeepseekV4GroupedLinear(heads_dim // config.o_groups,
                                                  config.o_groups * config.o_lora_rank,
                                                  config.o_groups), 12)
    x = torch.randn(3, config.o_groups, heads_dim // config.o_groups)
    with torch.no_grad():
        torch.testing.assert_close(grouped_linear_ref(x, layer.weight), layer(x), **TOL)
