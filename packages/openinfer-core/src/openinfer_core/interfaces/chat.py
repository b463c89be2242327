"""A model line's own chat renderer, for formats that are code rather than a Jinja template
(DeepSeek-V4 ships none: its format is a Python encoder).

A model line names one with `register(..., chat_encoder="module:Class")` in
`openinfer_register_models`; the class is built with no arguments. The server's tokenizer then
renders every chat prompt with it (`Tokenizer.apply_chat_template`), whatever template the
checkpoint holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class ChatEncoder(Protocol):
    """Conversation -> prompt text. Holds no state between calls; safe to call from several
    threads at once."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text, special tokens written as text (the caller encodes it without
        adding any). `messages` are OpenAI chat messages (`role`, `content` as a string, null
        or text parts, `tool_calls`, `tool_call_id`, `reasoning_content`, ...); `tools` the
        request's OpenAI tools; `kwargs` the request's `chat_template_kwargs` (such as
        `thinking` / `enable_thinking`, `reasoning_effort`), of which an encoder ignores those
        it does not know. Raises `openinfer_core.errors.InvalidParameterError` (a 400 from the
        server) for a conversation or argument it cannot render; anything else it raises is a
        bug."""
        ...


class ChatEncoderFactory(Protocol):
    """A registered chat encoder class: `cls()` gives the encoder."""

    def __call__(self) -> ChatEncoder: ...
