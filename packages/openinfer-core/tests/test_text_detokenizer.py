from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openinfer_core.text.detokenizer import IncrementalDetokenizer
from openinfer_core.text.tiktoken_bpe import tiktoken_to_tokenizer_json
from openinfer_core.text.tokenizer import Tokenizer

PATTERN = r""" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END = 260


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """Byte-level BPE with almost no merges: every non-ASCII character spans several tokens,
    and the emoji 🎉 (F0 9F 8E 89) splits as [F0 9F 8E][89]."""
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b"\xf0\x9f": 256, b"\xf0\x9f\x8e": 257, b"he": 258, b" w": 259})
    folder = tmp_path_factory.mktemp("bytes_tok")
    data = tiktoken_to_tokenizer_json(ranks, PATTERN, {"<|end|>": END})
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return Tokenizer.from_dir(folder)


def _stream(
    tok: Tokenizer, prompt: str, ids: list[int], skip_special_tokens: bool = True
) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, tok.encode(prompt), skip_special_tokens=skip_special_tokens)
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    assert detok.text == "".join(deltas)
    return deltas, detok.text


@pytest.mark.parametrize(
    "text",
    ["hello world", "🎉🎉 party", "世界 and 日本語", "mixed é ü 🙂 末尾🎉", "a\n\n\tb  c"],
)
def test_deltas_never_hold_a_broken_character_and_join_to_full_decode(
    tok: Tokenizer, text: str
) -> None:
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # the characters really are split across tokens
    deltas, full = _stream(tok, "Prompt: ", ids)
    assert full == tok.decode(ids) == text
    assert all("\ufffd" not in d for d in deltas)


def test_emoji_arrives_whole_when_its_last_byte_does(tok: Tokenizer) -> None:
    ids = tok.encode("🎉")
    assert len(ids) == 2
    detok = IncrementalDetokenizer(tok, [])
    assert detok.push(ids[0]) == ""
    assert detok.push(ids[1]) == "🎉"
    assert detok.flush() == ""


def test_flush_releases_an_unfinished_character(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, tok.encode("x"))
    assert detok.push(tok.encode("ok")[0]) == "o"
    assert detok.push(0xE4) == ""  # first byte of 世
    assert detok.flush() == "\ufffd"
    assert detok.text == "o\ufffd"


def test_special_tokens_skipped_or_kept(tok: Tokenizer) -> None:
    ids = [*tok.encode("hi"), END]
    assert "".join(_stream(tok, "p", ids)[0]) == "hi"
    assert "".join(_stream(tok, "p", ids, skip_special_tokens=False)[0]) == "hi<|end|>"


def test_work_per_token_stays_bounded(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, tok.encode("a long prompt " * 50))
    for i in tok.encode("word " * 500):
        detok.push(i)
        assert len(detok._ids) <= 8
    assert detok.text == "word " * 500


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([*range(0x20, 0x7F), *range(0x80, 0x100), 256, 257, 258]), max_size=25)
)
def test_any_byte_sequence_streams_to_its_full_decode(tok: Tokenizer, ids: list[int]) -> None:
    # Even invalid UTF-8 (lone continuation bytes) ends up exactly as a one-shot decode.
    assert _stream(tok, "prompt", ids)[1] == tok.decode(ids, skip_special_tokens=True)
