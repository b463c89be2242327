"""Which tool-call and reasoning parsers `openinfer serve` runs with, from the flags and the
model line's defaults.

Policy (vLLM's flag names): `--tool-call-parser NAME` picks the tool-call parser; without it
the model line's default applies (Qwen3: hermes), so `tools` with tool_choice "auto" work out
of the box; `--tool-call-parser none` turns tool-call parsing off, and such requests then get a
400 naming the flags. `--enable-auto-tool-choice` is accepted for vLLM command lines and only
checks that a parser results. Forced tool choices ("required", a named function) need no
parser. The reasoning parser is off unless `--reasoning-parser NAME` is given (as vLLM); the
model line's suggestion is logged."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

from openinfer_core.errors import OpenInferError
from openinfer_core.model_config import read_model_config
from openinfer_core.registry import Entry, Registries, Registry

log = logging.getLogger("openinfer.server")

OFF = "none"  # --tool-call-parser none


@dataclass(frozen=True, slots=True)
class ParserChoice:
    """Registered parser names (None: off). Plain strings: it crosses to frontend processes."""

    tool: str | None = None
    reasoning: str | None = None


def _installed(registry: Registry[object], extra: str = "") -> str:
    return ", ".join([*registry.names(), *([extra] if extra else [])]) or "none installed"


def check_parser_flags(args: argparse.Namespace, parser: argparse.ArgumentParser,
                       registries: Registries) -> None:
    """A name that is not installed is a command-line error (exit code 2) listing those that
    are; checked before anything loads."""
    tool, reasoning = args.tool_call_parser, args.reasoning_parser
    if tool is not None and tool != OFF and tool not in registries.tool_parsers:
        parser.error(f"argument --tool-call-parser: unknown tool-call parser {tool!r} "
                     f"(installed: {_installed(registries.tool_parsers, OFF)})")
    if reasoning is not None and reasoning not in registries.reasoning_parsers:
        parser.error(f"argument --reasoning-parser: unknown reasoning parser {reasoning!r} "
                     f"(installed: {_installed(registries.reasoning_parsers)})")
    if args.enable_auto_tool_choice and tool == OFF:
        parser.error("argument --enable-auto-tool-choice: needs a tool-call parser, but "
                     "--tool-call-parser none turns it off")


def choose_parsers(args: argparse.Namespace, parser: argparse.ArgumentParser,
                   registries: Registries, folder: Path) -> ParserChoice:
    """The parsers to serve with (after `check_parser_flags`), logged with where they came
    from."""
    line = _model_line(registries, folder)
    line_name = line.name if line is not None else "?"
    tool = args.tool_call_parser
    if tool == OFF:
        tool = None
        log.info("tool-call parser: off (--tool-call-parser none): requests with tools and "
                 'tool_choice "auto" are refused')
    elif tool is None:
        default = line.meta.get("tool_parser") if line is not None else None
        if default is not None and default in registries.tool_parsers:
            tool = default
            log.info("tool-call parser: %s (the %s model line's default; --tool-call-parser "
                     "NAME picks another, none turns it off)", tool, line_name)
        elif default is not None:
            log.warning("the %s model line names tool-call parser %r, which is not installed "
                        "(installed: %s)", line_name, default,
                        _installed(registries.tool_parsers))
        if tool is None and args.enable_auto_tool_choice:
            parser.error("argument --enable-auto-tool-choice: needs --tool-call-parser NAME "
                         f"(installed: {_installed(registries.tool_parsers)}); the "
                         f"{line_name} model line names no default")
    else:
        log.info("tool-call parser: %s", tool)
    reasoning = args.reasoning_parser
    suggested = line.meta.get("reasoning_parser") if line is not None else None
    if reasoning is not None:
        log.info("reasoning parser: %s", reasoning)
    elif suggested is not None:
        log.info("reasoning parser: off (the %s model line suggests --reasoning-parser %s, "
                 "which puts its reasoning in reasoning_content)", line_name, suggested)
    return ParserChoice(tool, reasoning)


def _model_line(registries: Registries, folder: Path) -> Entry | None:
    """The model line that will load `folder`; None if none does (the engine says why)."""
    try:
        return registries.models.match(read_model_config(folder))
    except OpenInferError:
        return None
