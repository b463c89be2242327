"""Reading a checkpoint folder's config.json, with errors that say what to fix."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

from openinfer_core.errors import ModelConfigError


def read_model_config(model_dir: str | Path) -> dict[str, Any]:
    """The parsed config.json of a HuggingFace checkpoint folder."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ModelConfigError(
            f"model folder {str(folder)!r} does not exist; pass a local HuggingFace checkpoint "
            "folder (with config.json, *.safetensors and tokenizer files)"
        )
    path = folder / "config.json"
    if not path.is_file():
        raise ModelConfigError(
            f"{str(folder)!r} has no config.json; a HuggingFace checkpoint folder needs one"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelConfigError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{path} is not UTF-8 text: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def read_json_if_present(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path} must hold a JSON object")
    return data


class ConfigReader:
    """Typed field access over a config dict; errors name the field and the file."""

    def __init__(self, config: dict[str, Any], source: str = "config.json") -> None:
        self.config = config
        self.source = source

    def int(self, name: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.config.get(name, default)
        if value is None:
            raise ModelConfigError(f"{self.source}: required field {name!r} is missing")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelConfigError(f"{self.source}: {name!r} must be an integer, got {value!r}")
        if value < minimum:
            raise ModelConfigError(f"{self.source}: {name!r} must be >= {minimum}, got {value}")
        return value

    def float(self, name: str, default: float | None = None) -> float:
        value = self.config.get(name, default)
        if value is None:
            raise ModelConfigError(f"{self.source}: required field {name!r} is missing")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ModelConfigError(f"{self.source}: {name!r} must be a number, got {value!r}")
        return float(value)

    def bool(self, name: str, default: bool) -> bool:
        value = self.config.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ModelConfigError(f"{self.source}: {name!r} must be true or false, got {value!r}")
        return value

    def grouped(self, name: str, group: str, default: builtins.int | None = None,
                group_default: builtins.int | None = None
                ) -> tuple[builtins.int, builtins.int]:
        """`name` and `group`, heads that share in groups (query heads over KV heads):
        `group` defaults to `name`'s count, and must divide it."""
        count = self.int(name, default)
        groups = self.int(group, count if group_default is None else group_default)
        if count % groups:
            raise ModelConfigError(
                f"{self.source}: {name} ({count}) must be a multiple of {group} ({groups})")
        return count, groups
