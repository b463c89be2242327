from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openinfer_core.errors import TokenizerError, TooManyTokensError
from openinfer_core.text.tiktoken_bpe import tiktoken_to_tokenizer_json
from openinfer_core.text.tokenizer import Tokenizer

PATTERN = r""" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPECIALS = {"<s>": 260, "</s>": 261, "<|eot|>": 262, "<mark>": 263}


def _write(folder: Path, name: str, data: Any) -> None:
    (folder / name).write_text(json.dumps(data) if not isinstance(data, str) else data)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A folder with a tiny byte-level tokenizer.json and nothing else."""
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b"hi": 256, b" t": 257, b"he": 258, b" the": 259})
    data = tiktoken_to_tokenizer_json(ranks, PATTERN, SPECIALS, not_special={"<mark>"})
    _write(tmp_path, "tokenizer.json", data)
    return tmp_path


def test_missing_tokenizer_json_names_folder_and_file(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer\.json is missing") as info:
        Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_missing_tokenizer_json_points_at_sentencepiece_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.model").write_bytes(b"\0")
    with pytest.raises(TokenizerError, match="SentencePiece"):
        Tokenizer.from_dir(tmp_path)


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        Tokenizer.from_dir(tmp_path / "absent")


def test_malformed_files_are_tokenizer_errors(model_dir: Path) -> None:
    _write(model_dir, "tokenizer_config.json", "{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json"):
        Tokenizer.from_dir(model_dir)
    _write(model_dir, "tokenizer.json", '{"model": 1}')
    with pytest.raises(TokenizerError, match="could not be loaded"):
        Tokenizer.from_dir(model_dir)


def test_encode_decode_and_special_tokens_in_text(model_dir: Path) -> None:
    tok = Tokenizer.from_dir(model_dir)
    ids = tok.encode("hi the<|eot|><mark>")
    assert ids == [256, 259, 262, 263]
    assert tok.decode(ids) == "hi the<|eot|><mark>"
    # <mark> is recognised whole but is ordinary text when special tokens are skipped.
    assert tok.decode(ids, skip_special_tokens=True) == "hi the<mark>"
    assert tok.convert_ids_to_tokens([259, 262, 9999]) == ["Ġthe", "<|eot|>", None]
    assert tok.vocab_size == 264
    assert tok.all_special_ids == frozenset({260, 261, 262})
    assert tok.chat_template is None
    assert tok.eos_token_ids == ()


def test_eos_ids_from_generation_config_list_then_tokenizer(model_dir: Path) -> None:
    _write(model_dir, "generation_config.json", {"eos_token_id": [262, 261]})
    _write(model_dir, "tokenizer_config.json", {"eos_token": {"content": "</s>"}})
    _write(model_dir, "config.json", {"eos_token_id": 7})
    tok = Tokenizer.from_dir(model_dir)
    assert tok.eos_token == "</s>"
    assert tok.eos_token_ids == (262, 261)


def test_eos_ids_tokenizer_token_added_after_generation_config(model_dir: Path) -> None:
    _write(model_dir, "generation_config.json", {"eos_token_id": 262})
    _write(model_dir, "tokenizer_config.json", {"eos_token": "</s>"})
    assert Tokenizer.from_dir(model_dir).eos_token_ids == (262, 261)


def test_eos_ids_fall_back_to_config_json(model_dir: Path) -> None:
    _write(model_dir, "config.json", {"eos_token_id": [261, 262]})
    assert Tokenizer.from_dir(model_dir).eos_token_ids == (261, 262)


def test_add_bos_token_prepends_once(model_dir: Path) -> None:
    _write(model_dir, "tokenizer_config.json", {"bos_token": "<s>", "add_bos_token": True})
    tok = Tokenizer.from_dir(model_dir)
    assert tok.bos_token == "<s>"
    assert tok.encode("hi") == [260, 256]
    assert tok.encode("<s>hi") == [260, 256]
    assert tok.encode("hi", add_special_tokens=False) == [256]


def test_chat_template_from_config_with_bos_variable(model_dir: Path) -> None:
    template = "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
    _write(model_dir, "tokenizer_config.json", {"chat_template": template, "bos_token": "<s>"})
    tok = Tokenizer.from_dir(model_dir)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<s>user:hi;"


def test_named_chat_templates_pick_tool_use_when_tools_given(model_dir: Path) -> None:
    templates = [
        {"name": "default", "template": "plain"},
        {"name": "tool_use", "template": "tools={{ tools | length }}"},
    ]
    _write(model_dir, "tokenizer_config.json", {"chat_template": templates})
    tok = Tokenizer.from_dir(model_dir)
    assert tok.apply_chat_template([]) == "plain"
    assert tok.apply_chat_template([], tools=[{"name": "f"}]) == "tools=1"


def test_chat_template_jinja_file_overrides_config(model_dir: Path) -> None:
    _write(model_dir, "tokenizer_config.json", {"chat_template": "from config"})
    _write(model_dir, "chat_template.jinja", "from file{% if add_generation_prompt %}+{% endif %}")
    tok = Tokenizer.from_dir(model_dir)
    assert tok.apply_chat_template([]) == "from file+"
    assert tok.apply_chat_template([], add_generation_prompt=False) == "from file"


def test_apply_chat_template_without_template_says_so(model_dir: Path) -> None:
    with pytest.raises(TokenizerError, match="no chat template"):
        Tokenizer.from_dir(model_dir).apply_chat_template([{"role": "user", "content": "x"}])


def test_bad_chat_template_entry(model_dir: Path) -> None:
    _write(model_dir, "tokenizer_config.json", {"chat_template": [{"template": "x"}]})
    with pytest.raises(TokenizerError, match="name"):
        Tokenizer.from_dir(model_dir)


def test_encode_max_tokens_counts_before_listing_ids(model_dir: Path) -> None:
    tok = Tokenizer.from_dir(model_dir)
    assert tok.encode("hi the", max_tokens=2) == tok.encode("hi the") == [256, 259]
    with pytest.raises(TooManyTokensError) as info:
        tok.encode("hi the", max_tokens=1)
    assert (info.value.count, info.value.limit, info.value.param) == (2, 1, "prompt")
    _write(model_dir, "tokenizer_config.json", {"bos_token": "<s>", "add_bos_token": True})
    with_bos = Tokenizer.from_dir(model_dir)
    assert with_bos.encode("hi the", max_tokens=3) == [260, 256, 259]
    with pytest.raises(TooManyTokensError) as info:  # the BOS counts
        with_bos.encode("hi the", max_tokens=2)
    assert info.value.count == 3
