"""A toy `interfaces.chat.ChatEncoder` for the server tests: it writes what reached it as
plain lines, so a prompt it rendered cannot be mistaken for the checkpoint's template's. A
message whose content is "refuse" is a request mistake (400); "crash" is an encoder bug."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from openinfer_core.errors import InvalidParameterError

TARGET = "toy_chat_encoder:ToyChatEncoder"


class ToyChatEncoder:
    def render(self, messages: Sequence[Mapping[str, Any]], *,
               tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        lines = []
        for message in messages:
            if message["content"] == "refuse":
                raise InvalidParameterError("messages", "the toy encoder refuses this")
            if message["content"] == "crash":
                raise KeyError("a bug in the toy encoder")
            lines.append(f"{message['role']}: {message['content']}")
        if tools:
            lines.append("tools: " + ", ".join(t["function"]["name"] for t in tools))
        if kwargs:
            lines.append("options: " + json.dumps(kwargs, sort_keys=True))
        if add_generation_prompt:
            lines.append("assistant:")
        return "\n".join(lines)
