"""Exceptions for user mistakes. Each message says what was wrong and what to do about it."""

from __future__ import annotations


class OpenInferError(Exception):
    """Base of every error openinfer raises on purpose."""


class InvalidParameterError(OpenInferError, ValueError):
    """A request or sampling parameter is out of range; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class TooManyTokensError(InvalidParameterError):
    """A text has more tokens than its caller allows; `count` is how many it has."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__("prompt", f"has {count} tokens, more than the {limit} allowed")
        self.count = count
        self.limit = limit


class ModelConfigError(OpenInferError):
    """config.json is missing, malformed, or describes something we cannot run."""


class UnsupportedModelError(ModelConfigError):
    """No installed model line accepts this checkpoint's architecture."""


class WeightLoadError(OpenInferError):
    """A checkpoint tensor is missing, mis-shaped, or the files are unreadable."""


class TokenizerError(OpenInferError):
    """The tokenizer files are missing or unusable."""


class PluginError(OpenInferError):
    """A plugin or registry entry could not be found or loaded."""
