"""The config checks model lines share: heads that group (`ConfigReader.grouped`) and the
context length to serve (`LoadOptions.model_len`), each refusal naming the fields."""

from __future__ import annotations

import pytest
import torch

from openinfer_core.errors import ModelConfigError
from openinfer_core.interfaces.model import LoadOptions
from openinfer_core.model_config import ConfigReader


def test_grouped_heads_default_to_one_group_each() -> None:
    r = ConfigReader({"num_attention_heads": 32})
    assert r.grouped("num_attention_heads", "num_key_value_heads") == (32, 32)
    r = ConfigReader({"num_attention_heads": 32, "num_key_value_heads": 8})
    assert r.grouped("num_attention_heads", "num_key_value_heads") == (32, 8)
    assert ConfigReader({}).grouped("v", "k", 32, 16) == (32, 16)


def test_grouped_heads_must_divide() -> None:
    r = ConfigReader({"num_attention_heads": 12, "num_key_value_heads": 8})
    with pytest.raises(ModelConfigError, match=r"config.json: num_attention_heads \(12\) must "
                       r"be a multiple of num_key_value_heads \(8\)"):
        r.grouped("num_attention_heads", "num_key_value_heads")


def options(max_model_len: int | None) -> LoadOptions:
    return LoadOptions(device=torch.device("cpu"), dtype=torch.float32, attention=None,  # type: ignore[arg-type]
                       max_model_len=max_model_len)


def test_model_len_is_the_models_unless_set() -> None:
    assert options(None).model_len(4096) == 4096
    assert options(1024).model_len(4096) == 1024
    assert options(4096).model_len(4096) == 4096


def test_a_longer_model_len_than_the_models_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="max_model_len 4097 exceeds the model's "
                       "max_position_embeddings 4096"):
        options(4097).model_len(4096)
