"""The literal text of DeepSeek-V4's chat format: special tokens, the DSML tool-call markup and
the fixed instruction texts the model was trained on. Facts of the wire format, written out as
the official encoder (`encoding/encoding_dsv4.py` of the checkpoint) emits them; a changed
character changes the prompt the model sees."""

from __future__ import annotations

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
LATEST_REMINDER = "<｜latest_reminder｜>"
THINK_START = "<think>"
THINK_END = "</think>"

# Quick-instruction tasks (a message's "task" field): DeepSeek's own classification prompts.
TASK_TOKENS = {
    "action": "<｜action｜>",
    "query": "<｜query｜>",
    "authority": "<｜authority｜>",
    "domain": "<｜domain｜>",
    "title": "<｜title｜>",
    "read_url": "<｜read_url｜>",
}

# DSML, the tool-call markup. `｜DSML｜` is one token; the tags around it are plain text.
DSML = "｜DSML｜"
CALLS_OPEN = f"<{DSML}tool_calls>"
CALLS_CLOSE = f"</{DSML}tool_calls>"
INVOKE_OPEN = f"<{DSML}invoke"  # then ` name="NAME">`
INVOKE_CLOSE = f"</{DSML}invoke>"
PARAMETER_OPEN = f"<{DSML}parameter"  # then ` name="KEY" string="true|false">VALUE`
PARAMETER_CLOSE = f"</{DSML}parameter>"

TOOL_RESULT_OPEN, TOOL_RESULT_CLOSE = "<tool_result>", "</tool_result>"

# Prepended to the first message in thinking mode with reasoning_effort "max".
REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n"
)

# The "## Tools" section appended to the message that carries the tools; the schemas (one
# JSON object per line) go between TOOLS_HEAD and TOOLS_TAIL.
TOOLS_HEAD = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke "
    f'tools by writing a "{CALLS_OPEN}" block like the following:\n\n'
    f"{CALLS_OPEN}\n"
    f'{INVOKE_OPEN} name="$TOOL_NAME">\n'
    f'{PARAMETER_OPEN} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE'
    f"{PARAMETER_CLOSE}\n"
    "...\n"
    f"{INVOKE_CLOSE}\n"
    f'{INVOKE_OPEN} name="$TOOL_NAME2">\n'
    "...\n"
    f"{INVOKE_CLOSE}\n"
    f"{CALLS_CLOSE}\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other '
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    '`string="false"`.\n\n'
    f"If thinking_mode is enabled (triggered by {THINK_START}), you MUST output your complete "
    f"reasoning inside {THINK_START}...{THINK_END} BEFORE any tool calls or final response.\n\n"
    f"Otherwise, output directly after {THINK_END} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
TOOLS_TAIL = (
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n"
)

RESPONSE_FORMAT_HEAD = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
)
