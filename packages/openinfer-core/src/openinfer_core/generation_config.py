"""Sampling defaults from a checkpoint's generation_config.json, as vLLM's
`--generation-config auto` applies them: a request that leaves a field out gets the model
creator's recommended value instead of the neutral built-in one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openinfer_core.errors import InvalidParameterError, ModelConfigError
from openinfer_core.model_config import read_json_if_present
from openinfer_core.params import SamplingParams

GENERATION_CONFIG_MODES = ("auto", "vllm")

# The fields vLLM takes from generation_config.json; HF's max_new_tokens is our max_tokens.
SAMPLING_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")

# transformers' GenerationConfig defaults. vLLM reads the file through `to_diff_dict()`, which
# drops a value equal to these (a top_k of 50 written out is not applied), so we do too.
_HF_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": 50,
                                "repetition_penalty": 1.0}


def sampling_defaults(mode: str, model_dir: str | Path) -> dict[str, Any]:
    """The defaults a request gets for the fields it leaves out, keyed by SamplingParams field
    name (temperature, top_k, top_p, min_p, repetition_penalty, max_tokens); {} when the model
    recommends none. `mode`: "auto" (the model folder's generation_config.json), "vllm" (none:
    the built-in defaults) or a folder holding a generation_config.json.

    Raises ModelConfigError when the file holds a value no request could use."""
    if mode == "vllm":
        return {}
    folder = Path(model_dir) if mode == "auto" else Path(mode)
    if mode != "auto" and not folder.is_dir():
        raise ModelConfigError(
            f"--generation-config {mode!r} is not a folder; pass auto, vllm, or a folder "
            "holding a generation_config.json")
    path = folder / "generation_config.json"
    config = read_json_if_present(path)
    defaults = {name: config[name] for name in SAMPLING_FIELDS
                if config.get(name) is not None and config[name] != _HF_DEFAULTS.get(name)}
    if config.get("max_new_tokens") is not None:
        defaults["max_tokens"] = config["max_new_tokens"]
    try:
        SamplingParams(**defaults)
    except (InvalidParameterError, TypeError) as exc:
        raise ModelConfigError(
            f"{path}: {exc}; fix the file, or pass --generation-config vllm to ignore it"
        ) from exc
    return defaults
