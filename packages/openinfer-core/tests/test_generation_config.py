"""Sampling defaults from generation_config.json, as vLLM's --generation-config reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openinfer_core.errors import ModelConfigError
from openinfer_core.generation_config import sampling_defaults


def folder_with(tmp_path: Path, config: dict[str, Any], name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps(config))
    return folder


QWEN3 = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": True,
         "temperature": 0.6, "top_p": 0.95, "top_k": 20, "transformers_version": "4.51.0"}


def test_auto_reads_the_sampling_fields(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, QWEN3)
    assert sampling_defaults("auto", folder) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


def test_max_new_tokens_becomes_max_tokens(tmp_path: Path) -> None:
    folder = folder_with(tmp_path, {"min_p": 0.05, "repetition_penalty": 1.05,
                                    "max_new_tokens": 256, "max_length": 4096})
    assert sampling_defaults("auto", folder) == {
        "min_p": 0.05, "repetition_penalty": 1.05, "max_tokens": 256}


def test_transformers_defaults_and_nulls_are_not_applied(tmp_path: Path) -> None:
    # vLLM reads the file through GenerationConfig.to_diff_dict(), which drops these.
    folder = folder_with(tmp_path, {"temperature": 1.0, "top_p": 1.0, "top_k": 50,
                                    "repetition_penalty": 1.0, "min_p": None})
    assert sampling_defaults("auto", folder) == {}


def test_vllm_ignores_the_file_and_a_missing_file_gives_none(tmp_path: Path) -> None:
    assert sampling_defaults("vllm", folder_with(tmp_path, QWEN3)) == {}
    assert sampling_defaults("auto", tmp_path) == {}


def test_a_folder_names_another_generation_config(tmp_path: Path) -> None:
    model = folder_with(tmp_path, QWEN3)
    other = folder_with(tmp_path, {"temperature": 0.2}, name="other")
    assert sampling_defaults(str(other), model) == {"temperature": 0.2}
    with pytest.raises(ModelConfigError, match="not a folder"):
        sampling_defaults(str(tmp_path / "missing"), model)


@pytest.mark.parametrize("config", [{"temperature": -1}, {"top_p": 0},
                                    {"max_new_tokens": 0}, {"top_k": "many"}])
def test_unusable_values_fail_at_start(tmp_path: Path, config: dict[str, Any]) -> None:
    with pytest.raises(ModelConfigError, match="--generation-config vllm"):
        sampling_defaults("auto", folder_with(tmp_path, config))
