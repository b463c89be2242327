"""A tiny transformers DeepseekV4Config with one layer of each attention kind (window only,
CSA at ratio 4, HCA at ratio 8), a hash MoE layer first, YaRN on the compressed layers; and a
DeepseekV4ForCausalLM of it with random weights. The indexer has 8 heads: with few, entries
that every head's ReLU zeroes tie at score 0, and transformers' `torch.topk` breaks such ties
its own way (the line gives them to the earlier entry).

Without a CUDA device, the kernel tests (`kernels/`) run the Triton kernels on CPU tensors under
the Triton interpreter; with one, they run compiled (`-m gpu` adds the large cases)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # The workspace's root conftest.py sets this before anything imports triton; this covers a
    # run of this package's tests on their own.
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Every @triton.jit, triton's own tl.cdiv and tl.sum included, chose the compiler when it
        # was imported; launching on CPU tensors would fail test by test, obscurely.
        raise pytest.UsageError(
            "triton was imported before TRITON_INTERPRET=1 was set, so the kernel tests cannot "
            "run under the interpreter: set TRITON_INTERPRET=1 in the environment, or set it in "
            "a conftest.py that pytest loads before the tests that import the kernels")
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))  # dsv4_checkpoints
# The FP4 MoE tests share their case builder (test_fp4_moe_decode.py imports test_fp4_moe).
sys.path.insert(0, str(Path(__file__).parent / "kernels"))

from dsv4_checkpoints import random_model


@pytest.fixture(scope="module")
def config():  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    return transformers.DeepseekV4Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, head_dim=16,
        q_lora_rank=8, o_groups=2, o_lora_rank=8, n_routed_experts=8, num_experts_per_tok=3,
        moe_intermediate_size=32, swiglu_limit=1.5, index_n_heads=8, index_head_dim=16,
        index_topk=4, sliding_window=8, hc_sinkhorn_iters=20,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "moe"],
        rope_scaling={"type": "yarn", "factor": 16, "beta_fast": 32,
                      "original_max_position_embeddings": 65536, "beta_slow": 1},
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8})


@pytest.fixture(scope="module")
def model(config):  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    return random_model(config, scale=0.2)
