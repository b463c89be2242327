"""The whole-sequence model (reference.forward over weights mapped from transformers' names)
against transformers' DeepseekV4ForCausalLM in fp32: logits within 1e-4 relative, for a config
with every attention kind and both MoE routings, prompts that slide the window and fill
compressed entries of both ratios, and more candidate entries than the indexer keeps."""

from __future__ import annotations

import json

import pytest
import torch

from openinfer_deepseek_v4.config import DeepseekV4Config
from openinfer_deepseek_v4.hf_names import weights_from_transformers
from openinfer_deepseek_v4.reference import forward


@pytest.mark.parametrize("tokens", [1, 6, 45])
def test_logits_match_transformers(model, config, tokens: int) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, config.vocab_size, (tokens,), generator=g)
    cfg = DeepseekV4Config.from_dict(json.loads(config.to_json_string()))
    with torch.no_grad():
        want = model(input_ids=ids[None]).logits[0].float()
        ours = forward(ids, weights_from_transformers(model.state_dict(), cfg), cfg)
    assert ours.shape == (tokens, config.vocab_size)
    torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_greedy_continuation_matches_transformers_generate(model, config) -> None:  # type: ignore[no-untyped-def]
    """32 greedy tokens: the reference recomputes the whole sequence for each, transformers
    decodes from its caches (window, compressor states, indexer keys); the tokens agree."""
    cfg = DeepseekV4Config.from_dict(json.loads(config.to_json_string()))
    weights = weights_from_transformers(model.state_dict(), cfg)
    prompt = torch.randint(0, config.vocab_size, (13,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model.generate(prompt[None], max_new_tokens=32, do_sample=False,
                              min_new_tokens=32)[0, 13:]
        ids = prompt
        for _ in range(32):
            ids = torch.cat([ids, forward(ids, weights, cfg)[-1].argmax()[None]])
    assert ids[13:].tolist() == want.tolist()
