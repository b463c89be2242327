"""Tiny random Qwen3 checkpoints in the exact HuggingFace layout, written by transformers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

QWEN3_VOCAB = 151936
QWEN3_EOS = [151645, 151643]


@dataclass(frozen=True)
class TinySpec:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    rope_theta: float = 1_000_000.0
    vocab_size: int = QWEN3_VOCAB
    max_position_embeddings: int = 512

    def hf_config(self) -> Any:
        from transformers import Qwen3Config

        return Qwen3Config(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            rms_norm_eps=1e-6,
            bos_token_id=151643,
            eos_token_id=151645,
            initializer_range=0.25,  # wide logits: greedy picks are far from ties
        )


SPECS = {
    s.name: s
    for s in [
        TinySpec("gqa-tied", 64, 2, 4, 2, 16, 128, tie_word_embeddings=True),
        TinySpec("mha-untied", 48, 3, 3, 3, 16, 96, tie_word_embeddings=False),
        # head_dim * heads != hidden, one kv head, odd widths, a different rope base
        TinySpec("odd-sizes", 40, 2, 5, 1, 24, 72, tie_word_embeddings=False, rope_theta=10_000.0),
    ]
}


def write_checkpoint(spec: TinySpec, dest: Path, *, seed: int = 0,
                     with_tokenizer: bool = True) -> Path:
    """Save a random-weight Qwen3ForCausalLM with `save_pretrained` (sharded, with an index),
    generation_config.json with both end-of-sequence ids, and the real Qwen3 tokenizer."""
    from transformers import GenerationConfig, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(spec.hf_config()).eval()
    _spread_norms(model)
    model.generation_config = GenerationConfig(
        bos_token_id=151643, eos_token_id=list(QWEN3_EOS), pad_token_id=151643,
        do_sample=True, temperature=0.6, top_p=0.95, top_k=20)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, max_shard_size="8MB")
    if with_tokenizer:
        from openinfer_qwen3.tokenizer_files import write_qwen3_tokenizer

        write_qwen3_tokenizer(dest)
    return dest


def _spread_norms(model: torch.nn.Module) -> None:
    """Norm weights away from 1, so that a mistake in applying them shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))


def load_hf(path: Path) -> Any:
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()


def write_embedding_checkpoint(spec: TinySpec, dest: Path, *, seed: int = 0,
                               modules: bool = True) -> Path:
    """A random-weight base `Qwen3Model` saved as sentence-transformers saves Qwen3-Embedding:
    tensors without the "model." prefix, no LM head, and (with `modules`) modules.json with
    last-token Pooling and Normalize; with the real Qwen3 tokenizer."""
    import json

    from transformers import Qwen3Model

    from openinfer_qwen3.tokenizer_files import write_qwen3_tokenizer

    torch.manual_seed(seed)
    model = Qwen3Model(spec.hf_config()).eval()
    _spread_norms(model)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, max_shard_size="8MB")
    write_qwen3_tokenizer(dest)
    if modules:
        (dest / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}]))
        (dest / "1_Pooling").mkdir(exist_ok=True)
        (dest / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": spec.hidden_size, "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
            "pooling_mode_lasttoken": True, "include_prompt": True}))
        (dest / "2_Normalize").mkdir(exist_ok=True)
    return dest


@torch.no_grad()
def hf_embedding(path: Path, token_ids: list[int]) -> torch.Tensor:
    """Qwen3-Embedding's recipe in transformers, fp32: the base model's last hidden state
    (final norm applied) at the last token, L2-normalized."""
    import torch.nn.functional as F
    from transformers import Qwen3Model

    model = Qwen3Model.from_pretrained(path, torch_dtype=torch.float32).eval()
    hidden = model(torch.tensor([token_ids])).last_hidden_state[0, -1]
    return F.normalize(hidden, dim=-1)
