"""`--load-format dummy` at real shapes, the published 4B config's reading, and the demo
checkpoint's weights (written without transformers) loading and running."""

from __future__ import annotations

import json

import torch
from harness import Harness, load

from openinfer_qwen35.config import Qwen35Config
from openinfer_qwen35.demo import write_demo_checkpoint
from openinfer_qwen35.shapes import QWEN35_SHAPES, reduced_depth, write_config_folder
from openinfer_qwen35.state_cache import StateCache


def test_published_4b_config_reads_as_its_shapes() -> None:
    cfg = Qwen35Config.from_dict(QWEN35_SHAPES["Qwen3.5-4B"])
    assert cfg.multimodal and cfg.tie_word_embeddings
    assert (cfg.hidden_size, cfg.num_layers, len(cfg.full_layers)) == (2560, 32, 8)
    assert (cfg.conv_dim, cfg.value_dim, cfg.rotary_dim) == (8192, 4096, 64)
    # 24 linear layers: a 32 x 128 x 128 fp32 state and a 3-input window of 8192 channels
    # (bf16) each.
    assert StateCache.bytes_per_slot(cfg, torch.bfloat16) == 24 * (2 << 20) + 24 * 8192 * 3 * 2


def test_dummy_weights_at_reduced_4b_depth(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_config_folder("Qwen3.5-4B", tmp_path, layers=4)
    assert Qwen35Config.from_dict(reduced_depth("Qwen3.5-4B", 4)).full_layers == (3,)
    # The layers at their real widths; the vocabulary cut (its table alone is 2.5 GB in fp32).
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["text_config"]["vocab_size"] = 1024
    path.write_text(json.dumps(config))
    model = load(tmp_path, load_format="dummy")
    logits = Harness(model, num_blocks=16, num_slots=2).step([("a", [1, 2, 3])])
    assert logits.shape == (1, 1024) and torch.isfinite(logits).all()


def test_demo_checkpoint_loads_and_decodes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_demo_checkpoint(tmp_path)
    model = load(tmp_path)
    out = Harness(model).greedy("a", [9707, 11, 1879, 0], 6)
    assert len(out) == 6 and all(0 <= t < 151936 for t in out)
