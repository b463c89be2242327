from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import tiktoken
import tokenizers

from openinfer_core.errors import TokenizerError
from openinfer_core.text.tiktoken_bpe import (
    byte_to_unicode,
    bytes_to_byte_level,
    load_tiktoken_ranks,
    recover_merges,
    tiktoken_to_tokenizer_json,
)

PATTERN = r"""'s|'t| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _tiny_ranks() -> dict[bytes, int]:
    """Every byte, then a few merges chosen so that some words need several merge steps and
    some characters (the emoji, 世) stay split across tokens."""
    ranks = {bytes([b]): b for b in range(256)}
    for token in [
        b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b"ld", b" world",
        b"\xf0\x9f", b"\xf0\x9f\x8e", b"\xe4\xb8", b" t", b"th", b" th", b"e ", b"  ",
    ]:  # fmt: skip
        ranks[token] = len(ranks)
    return ranks


SPECIALS = {"<|end|>": 273, "<|start|>": 274}


def test_byte_alphabet_is_a_bijection_with_space_moved() -> None:
    table = byte_to_unicode()
    assert len(set(table)) == 256
    assert table[ord(" ")] == "Ġ"
    assert table[ord("\n")] == "Ċ"
    assert table[ord("a")] == "a"
    assert all(" " not in ch for ch in table)
    assert bytes_to_byte_level(b"a b\n") == "aĠbĊ"


def test_load_ranks_reads_base64_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.tiktoken"
    lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in [(b"a", 0), (b" b", 1)]]
    path.write_text("\n".join(lines) + "\n\n")
    assert load_tiktoken_ranks(path) == {b"a": 0, b" b": 1}


def test_load_ranks_rejects_garbage_with_line_number(tmp_path: Path) -> None:
    path = tmp_path / "bad.tiktoken"
    path.write_text("YQ== 0\nnot a rank line at all\n")
    with pytest.raises(TokenizerError, match="line 2"):
        load_tiktoken_ranks(path)


def test_load_ranks_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"nope\.tiktoken"):
        load_tiktoken_ranks(tmp_path / "nope.tiktoken")


def test_merges_ordered_by_merged_rank_then_piece_ranks() -> None:
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5}
    assert recover_merges(ranks) == [
        (b"a", b"b"),
        (b"b", b"c"),
        (b"a", b"bc"),  # pieces ranked (0, 4) come before (3, 2)
        (b"ab", b"c"),
    ]


def test_tokenizer_json_shape() -> None:
    data = tiktoken_to_tokenizer_json(_tiny_ranks(), PATTERN, SPECIALS, not_special={"<|start|>"})
    assert data["normalizer"] == {"type": "NFC"}
    split, byte_level = data["pre_tokenizer"]["pretokenizers"]
    assert split["pattern"] == {"Regex": PATTERN}
    assert split["behavior"] == "Isolated"
    assert byte_level["add_prefix_space"] is False and byte_level["use_regex"] is False
    assert data["decoder"]["type"] == "ByteLevel"
    assert data["model"]["vocab"]["Ġworld"] == _tiny_ranks()[b" world"]
    assert "Ġwor ld" in data["model"]["merges"]
    added = {t["content"]: (t["id"], t["special"]) for t in data["added_tokens"]}
    assert added == {"<|end|>": (273, True), "<|start|>": (274, False)}


def test_rejects_special_ids_that_collide_with_ranks() -> None:
    with pytest.raises(ValueError, match="collide"):
        tiktoken_to_tokenizer_json(_tiny_ranks(), PATTERN, {"<|x|>": 5})


TEXTS = [
    "hello world",
    "hellohello  world\n\nthe the  the",
    "Hello World! 'sup it's 123 4567",
    "🎉 party 世界 世世",
    "tabs\t\tand   spaces   \n  \n",
    "<|start|>hello<|end|> world<|end|>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_matches_tiktoken_on_tiny_vocabulary(text: str) -> None:
    ranks = _tiny_ranks()
    backend = tokenizers.Tokenizer.from_str(
        json.dumps(tiktoken_to_tokenizer_json(ranks, PATTERN, SPECIALS))
    )
    reference = tiktoken.Encoding(
        "tiny", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=SPECIALS
    )
    ids = backend.encode(text).ids
    assert ids == reference.encode(text, allowed_special="all")
    assert backend.decode(ids, skip_special_tokens=False) == text
