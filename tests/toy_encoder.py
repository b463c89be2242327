"""A chat encoder for test_llm.py's model line (`chat_encoder="toy_encoder:PlainEncoder"`)."""

from __future__ import annotations

from typing import Any


class PlainEncoder:
    def render(self, messages: Any, *, tools: Any = None, add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
