"""`<think>…</think>` reasoning, as Qwen3, QwQ and DeepSeek-R1 write it."""

from __future__ import annotations

from enum import Enum

from openinfer_core.interfaces.parsers import ReasoningParse
from openinfer_core.text.tags import undecided_tail

START, END = "<think>", "</think>"


class _State(Enum):
    START = "start"  # the output may begin with <think>
    MAYBE = "maybe"  # no <think> and an unknown prompt: reasoning only if </think> follows
    REASONING = "reasoning"
    CONTENT = "content"


class Qwen3ReasoningParser:
    """`interfaces.parsers.ReasoningParser` for `<think>reasoning</think>content`.

    Where the output starts is read from the prompt first: a prompt that leaves a `<think>`
    open (templates that open the block for the model, such as Qwen3-Thinking-2507) starts the
    output in reasoning; a prompt that ends with a closed block (Qwen3 with
    `enable_thinking=false`) makes all of it content. Otherwise an output that begins with
    `<think>` is reasoning up to `</think>`, and one that does not is content. With no prompt
    (None), an output without `<think>` is reasoning up to a `</think>` if one follows, else
    content (streaming then holds it back until one of the two is seen).

    Reasoning is stripped of the whitespace around it, content of the whitespace right after
    `</think>`. Streaming holds back text that may begin a tag, and the whitespace before it."""

    # What an output that does not begin with <think> is when the prompt leaves it open
    # to either: False (Qwen3) content unless the prompt opened the block, True reasoning.
    reasoning_without_start = False

    def __init__(self, *, prompt: str | None = None) -> None:
        self._buf = ""
        self._strip = False  # drop the whitespace at the start of the current part
        self._prompt_known = prompt is not None
        if prompt is not None and prompt.rfind(START) > prompt.rfind(END):
            self._state, self._strip = _State.REASONING, True
        elif prompt is not None and prompt.rstrip().endswith(END):
            self._state = _State.CONTENT
        else:
            self._state = _State.START

    def feed(self, text: str) -> ReasoningParse:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> ReasoningParse:
        return self._drain(final=True)

    def _drain(self, final: bool) -> ReasoningParse:
        reasoning: list[str] = []
        content: list[str] = []
        while True:
            state = self._state
            if state is _State.START:
                head = self._buf.lstrip()
                if head.startswith(START):
                    self._buf = head[len(START):]
                    self._state, self._strip = _State.REASONING, True
                elif START.startswith(head) and not final:
                    break  # nothing yet, or a piece of <think>
                elif self.reasoning_without_start:
                    self._state, self._strip = _State.REASONING, True
                else:
                    self._state = _State.CONTENT if self._prompt_known else _State.MAYBE
                continue
            if state is _State.MAYBE:
                end = self._buf.find(END)
                if end >= 0:
                    reasoning.append(self._buf[:end].strip())
                    self._buf = self._buf[end + len(END):]
                    self._state, self._strip = _State.CONTENT, True
                    continue
                if final:
                    content.append(self._buf)
                    self._buf = ""
                break
            if self._strip:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._strip = False
            if state is _State.CONTENT:
                content.append(self._buf)
                self._buf = ""
                break
            end = self._buf.find(END)
            if end >= 0:
                reasoning.append(self._buf[:end].rstrip())
                self._buf = self._buf[end + len(END):]
                self._state, self._strip = _State.CONTENT, True
                continue
            cut = len(self._buf) if final else undecided_tail(self._buf, END, with_space=True)
            reasoning.append(self._buf[:cut])
            self._buf = self._buf[cut:]
            break
        return ReasoningParse("".join(reasoning), "".join(content))


class DeepSeekR1ReasoningParser(Qwen3ReasoningParser):
    """As `Qwen3ReasoningParser`, except that an output not beginning with `<think>` is
    reasoning up to `</think>` (all reasoning if none comes) unless the prompt closed the
    block: DeepSeek-R1 always reasons and may leave the opening tag out."""

    reasoning_without_start = True
