from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest
import tiktoken

from openinfer_core.cache_root import cache_root
from openinfer_core.text.detokenizer import IncrementalDetokenizer
from openinfer_core.text.tiktoken_bpe import load_tiktoken_ranks
from openinfer_core.text.tokenizer import Tokenizer
from openinfer_qwen3.tokenizer_files import (
    QWEN3_PATTERN,
    QWEN3_SPECIAL_TOKENS,
    qwen3_ranks_path,
    qwen3_tokenizer_json,
    write_qwen3_tokenizer,
)


@pytest.fixture(scope="session")
def qwen_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory, qwen_cache: Path) -> Path:
    """The Qwen3 tokenizer files, built once per session, cached in a temp folder."""
    folder = tmp_path_factory.mktemp("qwen3")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENINFER_CACHE_DIR", str(qwen_cache))
        write_qwen3_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def qwen(qwen_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(qwen_dir)


@pytest.fixture(scope="session")
def reference() -> tiktoken.Encoding:
    return tiktoken.Encoding(
        "qwen3-reference",
        pat_str=QWEN3_PATTERN,
        mergeable_ranks=load_tiktoken_ranks(qwen3_ranks_path()),
        special_tokens=QWEN3_SPECIAL_TOKENS,
    )


def _random_text(seed: int, length: int = 400) -> str:
    pieces = [
        "the", " The", "ing", "'s", "'LL", " 42", "3.14", "١٢٣", "\t", "\n", "\r\n", "  ", "    ",
        "\n\n\n", "é", "e\u0301", "ñ", "ß", "ﬁ", "世界", "こんにちは", "한국어", "Ω", "ж", "🎉",
        "👩‍👩‍👧", "🇫🇷", "{", "}", "()", "=>", "!=", "—", "…", "\u00a0", "\u200b", "<|im_end|>",
        "<think>", "_", "#", "0x1F", "αβγ", "ا", "\u0301", "\U0001F600", "\x00", "\x7f",
    ]  # fmt: skip
    rng = random.Random(seed)
    return "".join(rng.choice(pieces) for _ in range(length // 3))


TEXTS = {
    "english": "Hello, world! The quick brown fox jumps over the lazy dog. It's I'M we'd.",
    "cjk": "你好，世界！今天天气很好。日本語のテキストも。한국어 텍스트입니다。",
    "emoji": "emoji 🎉🙂 family 👩‍👩‍👧‍👦 flag 🇫🇷 skin 👍🏽 keycap 1️⃣",
    "code": "def f(x):\n\treturn x**2  # square\n\n\n\nclass A:\n    pass\n\n"
    "if a!=b: print(f'{a}')\n",
    "whitespace": "a  b   c    d\t\te\n\n\n\n\nf \n \n g   \r\n\r\n  end   ",
    "only spaces": "        ",
    "numbers": "123456789 1,000,000 0.001 1e-9 -42 ٣٤٥ ½ 2024-05-01",
    "accents": "café naïve résumé Ångström Ærøskøbing Łódź",
    "nfc sensitive": "cafe\u0301 A\u030angstro\u0308m n\u0303 \u212b",
    "specials": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok</think>\n\n"
    "<tool_call>{}</tool_call><|endoftext|>",
    "near specials": "<|im_start <think <|notatoken|> </think >",
    "empty": "",
    **{f"random {seed}": _random_text(seed) for seed in range(4)},
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_encodes_like_tiktoken_and_decodes_back(
    qwen: Tokenizer, reference: tiktoken.Encoding, name: str
) -> None:
    text = TEXTS[name]
    # The tokenizer NFC-normalizes first; tiktoken does not, so feed it the normalized text.
    normalized = unicodedata.normalize("NFC", text)
    ids = qwen.encode(text)
    assert ids == reference.encode(normalized, allowed_special="all")
    assert qwen.decode(ids) == normalized


def test_nfc_really_changes_the_tokens(qwen: Tokenizer) -> None:
    assert qwen.encode("cafe\u0301") == qwen.encode("café")
    assert qwen.encode("cafe\u0301", add_special_tokens=False) != []


def test_vocabulary_and_special_tokens(qwen: Tokenizer) -> None:
    assert qwen.vocab_size == 151669
    assert qwen.encode("<|im_end|>") == [151645]
    assert qwen.encode("<think></think>") == [151667, 151668]
    assert qwen.eos_token == "<|im_end|>"
    assert qwen.bos_token is None
    assert qwen.eos_token_ids == (151645,)
    assert 151643 in qwen.all_special_ids and 151667 not in qwen.all_special_ids
    ids = qwen.encode("<|im_start|>assistant\n<think>\nx\n</think>\n\nhi<|im_end|>")
    assert qwen.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nx\n</think>\n\nhi"


def test_transformers_loads_the_files(qwen_dir: Path, qwen: Tokenizer) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_file=str(qwen_dir / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(qwen_dir))
    for text in [TEXTS["emoji"], TEXTS["code"], TEXTS["specials"], TEXTS["random 0"]]:
        ids = qwen.encode(text)
        assert fast.encode(text, add_special_tokens=False) == ids
        assert auto.encode(text) == ids
        assert fast.decode(ids) == auto.decode(ids) == qwen.decode(ids)
    assert auto.eos_token == "<|im_end|>" and auto.pad_token == "<|endoftext|>"


def test_tokenizer_config_contents(qwen_dir: Path) -> None:
    config = json.loads((qwen_dir / "tokenizer_config.json").read_text())
    assert config["bos_token"] is None
    assert config["eos_token"] == "<|im_end|>"
    assert config["pad_token"] == "<|endoftext|>"
    assert config["model_max_length"] == 131072
    decoder = config["added_tokens_decoder"]
    assert len(decoder) == 26
    assert decoder["151645"]["content"] == "<|im_end|>" and decoder["151645"]["special"]
    assert decoder["151667"] == {
        "content": "<think>",
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": False,
    }


def test_rebuild_is_served_from_cache(
    qwen_dir: Path, qwen_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENINFER_CACHE_DIR", str(qwen_cache))
    assert cache_root() == qwen_cache
    cached = list((cache_root() / "tokenizers").glob("qwen3-*.json"))
    assert len(cached) == 1
    assert qwen3_tokenizer_json() == (qwen_dir / "tokenizer.json").read_text(encoding="utf-8")
    cached[0].write_text('{"from": "cache"}', encoding="utf-8")
    assert qwen3_tokenizer_json() == '{"from": "cache"}'


def test_generation_config_eos_list(qwen_dir: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((qwen_dir / name).read_bytes())
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [151645, 151643]}')
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == (151645, 151643)


SYSTEM_USER_HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
]
HISTORY_PROMPT = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n"
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
)


def test_chat_template_history_and_generation_prompt(qwen: Tokenizer) -> None:
    # Reasoning of earlier turns is dropped; the generation prompt opens an assistant turn.
    assert qwen.apply_chat_template(SYSTEM_USER_HISTORY) == (
        HISTORY_PROMPT + "<|im_start|>assistant\n"
    )
    assert qwen.apply_chat_template(SYSTEM_USER_HISTORY, add_generation_prompt=False) == (
        HISTORY_PROMPT
    )


def test_chat_template_thinking_toggle(qwen: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    on = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert qwen.apply_chat_template(messages) == on
    assert qwen.apply_chat_template(messages, enable_thinking=True) == on
    assert qwen.apply_chat_template(messages, enable_thinking=False) == (
        on + "<think>\n\n</think>\n\n"
    )


def test_chat_template_keeps_reasoning_after_last_query_and_tool_turns(qwen: Tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "weather", "description": "天气"}}]
    messages = [
        {"role": "user", "content": "Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "\nneed the tool\n",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "Nice"}},
                },
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rain"},
    ]
    prompt = qwen.apply_chat_template(messages, tools=tools)
    assert prompt.startswith("<|im_start|>system\n# Tools\n\n")
    assert (
        '\n{"type": "function", "function": {"name": "weather", "description": "天气"}}\n' in prompt
    )
    assert prompt.endswith(
        "<|im_start|>user\nParis?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nneed the tool\n</think>\n\n"
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Nice"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_prompt_tokenizes_with_single_special_ids(qwen: Tokenizer) -> None:
    ids = qwen.encode(qwen.apply_chat_template([{"role": "user", "content": "hi"}]))
    assert ids[0] == 151644 and ids.count(151645) == 1


@pytest.mark.parametrize("name", ["cjk", "emoji", "accents", "random 1"])
def test_detokenizer_streams_qwen_text(qwen: Tokenizer, name: str) -> None:
    text = unicodedata.normalize("NFC", TEXTS[name].replace("<|im_end|>", ""))
    ids = qwen.encode(text)
    pieces = [qwen.decode([i]) for i in ids]
    if name == "emoji":
        assert any("\ufffd" in p for p in pieces)  # some character really is split
    detok = IncrementalDetokenizer(qwen, qwen.encode("<|im_start|>assistant\n"))
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == qwen.decode(ids, skip_special_tokens=True)
