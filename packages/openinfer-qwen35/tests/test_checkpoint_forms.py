"""Both published layouts load: Qwen3_5ForConditionalGeneration serves its language model,
skips the vision tower with one log line and matches transformers' text-only logits; config
errors name the field."""

from __future__ import annotations

import logging

import pytest
import torch
from checkpoints import text_config, write_conditional_generation
from harness import Harness, load

from openinfer_core.errors import ModelConfigError
from openinfer_qwen35.config import Qwen35Config

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]


def test_conditional_generation_serves_its_language_model(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    hf = write_conditional_generation(tmp_path)
    with caplog.at_level(logging.INFO, logger="openinfer.qwen35"):
        model = load(tmp_path)
    skipped = [r.getMessage() for r in caplog.records if "vision-tower" in r.getMessage()]
    assert len(skipped) == 1 and "skipped" in skipped[0]
    assert model.cfg.multimodal
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([PROMPT])).logits[0]
    got = Harness(model).step([("a", PROMPT)], all_logits=True)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_layer_types_default_to_every_fourth_full() -> None:
    config = text_config(tie=True)
    del config["layer_types"]
    config["num_hidden_layers"] = 8
    cfg = Qwen35Config.from_dict(config)
    assert cfg.full_layers == (3, 7) and cfg.linear_layers == (0, 1, 2, 4, 5, 6)
    assert cfg.rotary_dim == 4  # 16 x 0.25


@pytest.mark.parametrize("change, field", [
    ({"model_type": "qwen3_5_moe_text"}, "qwen3_5_moe_text"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"layer_types": ["linear_attention"] * 4 + ["sliding_attention"]}, "layer_types[4]"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
])
def test_unsupported_configs_are_refused_by_name(change, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Qwen35Config.from_dict({**text_config(tie=True), **change})
