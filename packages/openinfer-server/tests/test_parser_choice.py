"""`openinfer serve`'s tool-call and reasoning parser flags: names checked at start, the model
line's default tool parser, `none`, and vLLM's --enable-auto-tool-choice."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from openinfer_core.plugins import PluginManager
from openinfer_server.cli import build_parser, main
from openinfer_server.parser_choice import ParserChoice, check_parser_flags, choose_parsers

REGS = PluginManager(autoload=True).registries


def checkpoint(tmp_path: Path, architecture: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return tmp_path


def choose(folder: Path, *flags: str) -> ParserChoice:
    parser = build_parser()
    args = parser.parse_args(["serve", *flags])
    check_parser_flags(args, parser, REGS)
    return choose_parsers(args, parser, REGS, folder)


def test_qwen3_gets_its_default_tool_parser_and_a_reasoning_hint(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    qwen3 = checkpoint(tmp_path, "Qwen3ForCausalLM")
    with caplog.at_level(logging.INFO, logger="openinfer.server"):
        assert choose(qwen3) == ParserChoice("hermes", None)
    assert "tool-call parser: hermes (the qwen3 model line's default" in caplog.text
    assert "suggests --reasoning-parser qwen3" in caplog.text
    assert choose(qwen3, "--enable-auto-tool-choice", "--reasoning-parser", "qwen3") == \
        ParserChoice("hermes", "qwen3")
    assert choose(qwen3, "--tool-call-parser", "none") == ParserChoice(None, None)


def test_a_line_without_a_default(tmp_path: Path) -> None:
    toy = checkpoint(tmp_path, "ToyCounterForCausalLM")
    assert choose(toy) == ParserChoice(None, None)
    assert choose(toy, "--tool-call-parser", "hermes") == ParserChoice("hermes", None)
    with pytest.raises(SystemExit) as exit_info:
        choose(toy, "--enable-auto-tool-choice")
    assert exit_info.value.code == 2


@pytest.mark.parametrize("flags, message", [
    (["--tool-call-parser", "nope"],
     "argument --tool-call-parser: unknown tool-call parser 'nope' (installed: deepseek_v4, "
     "hermes, none)"),
    (["--reasoning-parser", "nope"], "argument --reasoning-parser: unknown reasoning parser "
                                     "'nope' (installed: deepseek_r1, qwen3)"),
    (["--tool-call-parser", "none", "--enable-auto-tool-choice"],
     "--tool-call-parser none turns it off"),
])
def test_bad_flags_are_command_line_errors(flags: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--device", "cpu", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
