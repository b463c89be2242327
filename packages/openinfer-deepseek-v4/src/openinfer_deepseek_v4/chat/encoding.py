"""DeepSeek-V4's chat encoding: a conversation to the prompt text, as the checkpoint's
reference encoder (`encoding/encoding_dsv4.py`, `encode_messages`) writes it.

    BOS [reasoning-effort paragraph] system [\\n\\n## Tools ...]
    <｜User｜>user<｜Assistant｜></think>reply<｜end▁of▁sentence｜>      (chat mode)
    <｜User｜>user<｜Assistant｜><think>reasoning</think>reply
        \\n\\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls><｜end▁of▁sentence｜>  (thinking mode)
    <｜User｜><tool_result>...</tool_result><｜Assistant｜><think>

`encode_messages` is the reference's function (its message shapes, DeepSeek's extra roles
`developer` and `latest_reminder`, quick-instruction `task`s); `DeepseekV4ChatEncoder` is the
server's `interfaces.chat.ChatEncoder` over it (request tools, `thinking`, `reasoning_effort`,
`add_generation_prompt`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from openinfer_core.errors import InvalidParameterError
from openinfer_deepseek_v4.chat.markup import (
    ASSISTANT,
    BOS,
    CALLS_CLOSE,
    CALLS_OPEN,
    EOS,
    INVOKE_CLOSE,
    INVOKE_OPEN,
    LATEST_REMINDER,
    PARAMETER_CLOSE,
    PARAMETER_OPEN,
    REASONING_EFFORT_MAX,
    RESPONSE_FORMAT_HEAD,
    TASK_TOKENS,
    THINK_END,
    THINK_START,
    TOOL_RESULT_CLOSE,
    TOOL_RESULT_OPEN,
    TOOLS_HEAD,
    TOOLS_TAIL,
    USER,
)
from openinfer_deepseek_v4.chat.turns import (
    USER_ROLES,
    Call,
    ToolResult,
    Turn,
    conversation,
    drop_earlier_reasoning,
    last_user_index,
    tool_functions,
)

# OpenAI's and DeepSeek's reasoning_effort values -> the reference's (None, "high", "max").
# DeepSeek's API maps low and medium to high and xhigh to max; only "max" changes the prompt.
EFFORTS = {"none": None, "minimal": None, "low": "high", "medium": "high", "high": "high",
           "xhigh": "max", "max": "max"}


def encode_messages(messages: Sequence[Mapping[str, Any]], *, thinking: bool,
                    drop_thinking: bool = True, reasoning_effort: str | None = None,
                    add_bos: bool = True, generation_prompt: bool = True) -> str:
    """The prompt for `messages`, as the reference's `encode_messages(messages,
    thinking_mode="thinking" if thinking else "chat", drop_thinking=..., reasoning_effort=...)`.
    Tools ride on a system or developer message (`"tools": [...]`); with tools anywhere,
    earlier reasoning is kept. `generation_prompt=False` leaves out what follows the last
    message (`<｜Assistant｜>` and the thinking tag, or a task token)."""
    if reasoning_effort not in (None, "high", "max"):
        raise InvalidParameterError(
            "reasoning_effort", f'must be "high", "max" or null, got {reasoning_effort!r}')
    turns = conversation(messages)
    drop = drop_thinking and not any(t.tools for t in turns)
    if thinking and drop:
        turns = drop_earlier_reasoning(turns)
    last_user = last_user_index(turns)
    out = [BOS] if add_bos else []
    if thinking and reasoning_effort == "max" and turns:
        out.append(REASONING_EFFORT_MAX)
    for i, turn in enumerate(turns):
        if turn.role == "assistant":
            after_task = i > 0 and turns[i - 1].task is not None  # a task's answer: no thinking
            keep = thinking and not after_task and (not drop or i > last_user)
            out.append(_assistant(turn, keep))
        else:
            out.append(_turn_text(turn))
        # The hand-over to the assistant comes before its turn (a reminder may sit between)
        # and, for the generation prompt, after the last turn.
        following = turns[i + 1].role if i + 1 < len(turns) else None
        if following in ("assistant", "latest_reminder") or (following is None
                                                              and generation_prompt):
            opens = thinking and (not drop or i >= last_user)
            out.append(_hand_over(turn, thinking=thinking, opens_thinking=opens))
    return "".join(out)


def _turn_text(turn: Turn) -> str:
    if turn.role == "user":
        return USER + "\n\n".join(
            f"{TOOL_RESULT_OPEN}{p.text}{TOOL_RESULT_CLOSE}" if isinstance(p, ToolResult) else p
            for p in turn.parts)
    if turn.role == "latest_reminder":
        return LATEST_REMINDER + turn.text
    text = (USER if turn.role == "developer" else "") + turn.text  # system or developer
    if turn.tools:
        schemas = "\n".join(json.dumps(f, ensure_ascii=False) for f in turn.tools)
        text += "\n\n" + TOOLS_HEAD + schemas + TOOLS_TAIL
    if turn.response_format:
        text += "\n\n" + RESPONSE_FORMAT_HEAD + json.dumps(turn.response_format,
                                                           ensure_ascii=False)
    return text


def _assistant(turn: Turn, keep_reasoning: bool) -> str:
    reasoning = turn.reasoning + THINK_END if keep_reasoning else ""
    calls = ""
    if turn.calls:
        calls = f"\n\n{CALLS_OPEN}\n" + "\n".join(map(_invoke, turn.calls)) + f"\n{CALLS_CLOSE}"
    return reasoning + turn.text + calls + ("" if turn.wo_eos else EOS)


def _invoke(call: Call) -> str:
    parameters = "\n".join(
        f'{PARAMETER_OPEN} name="{key}" string="{"true" if isinstance(value, str) else "false"}">'
        f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        f"{PARAMETER_CLOSE}"
        for key, value in call.arguments.items())
    return f'{INVOKE_OPEN} name="{call.name}">\n{parameters}\n{INVOKE_CLOSE}'


def _hand_over(turn: Turn, *, thinking: bool, opens_thinking: bool) -> str:
    """What follows a turn the assistant answers: a task token, or `<｜Assistant｜>` and the
    thinking tag (open in thinking mode for the turn being answered, closed otherwise)."""
    if turn.task == "action":
        return ASSISTANT + (THINK_START if thinking else THINK_END) + TASK_TOKENS["action"]
    if turn.task is not None:
        return TASK_TOKENS[turn.task]
    if turn.role in USER_ROLES:
        return ASSISTANT + (THINK_START if opens_thinking else THINK_END)
    return ""


class DeepseekV4ChatEncoder:
    """`openinfer_core.interfaces.chat.ChatEncoder` for DeepSeek-V4 (registered on the model
    line as `chat_encoder=`). Request options, as vLLM reads them for DeepSeek-V3.1+:

    - `thinking` or `enable_thinking` (chat_template_kwargs, default false): thinking mode,
      the prompt ends with `<think>`; otherwise chat mode, ending with `</think>`.
    - `reasoning_effort` (default none): "max" (or "xhigh") prepends the reference's
      maximum-effort paragraph in thinking mode; "none", "minimal", "low", "medium" and "high"
      change nothing.
    - `drop_thinking` (default true): earlier turns' reasoning is left out in thinking mode,
      unless tools are given (then it is always kept, as the reference does).

    Request `tools` go on the leading system message (one with empty content is added when
    the conversation has none), as the reference's own tests place them."""

    def render(self, messages: Sequence[Mapping[str, Any]], *,
               tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        thinking = _flag(kwargs, "thinking") or _flag(kwargs, "enable_thinking")
        if add_generation_prompt and messages:
            last = messages[-1]
            role = last.get("role") if isinstance(last, Mapping) else None
            if role not in ("user", "tool", "developer"):
                raise InvalidParameterError(
                    "messages", f"the last message has role {role!r}; DeepSeek-V4 answers a "
                    "user or tool message (set add_generation_prompt false to render the "
                    "conversation as it is)")
        return encode_messages(
            _with_tools(messages, tools), thinking=thinking,
            drop_thinking=_flag(kwargs, "drop_thinking", default=True),
            reasoning_effort=_effort(kwargs.get("reasoning_effort")),
            generation_prompt=add_generation_prompt)


def _with_tools(messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    if not tools:
        return list(messages)
    tool_functions(tools, "tools", "tools")  # the request's mistakes named as its own
    first = messages[0] if messages else None
    if isinstance(first, Mapping) and first.get("role") == "system":
        return [{**first, "tools": tools}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": tools}, *messages]


def _flag(kwargs: Mapping[str, Any], name: str, *, default: bool = False) -> bool:
    value = kwargs.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidParameterError(
            "chat_template_kwargs", f"{name} must be true or false, got {value!r}")
    return value


def _effort(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in EFFORTS:
        raise InvalidParameterError(
            "reasoning_effort", f"must be one of {', '.join(EFFORTS)}, got {value!r}")
    return EFFORTS[value.lower()]
