"""`OPENINFER_DSV4_SIDE_STREAM`: the branches it names, the steps that take the side stream,
and a clear error for a name it does not know."""

from __future__ import annotations

import pytest

from openinfer_deepseek_v4.side_branches import (
    BRANCHES,
    SIDE_ENV,
    SIDE_TOKENS,
    side_branches,
    takes_side,
)


@pytest.mark.parametrize(("raw", "want"), [
    ("0", set()), ("", set()), ("1", set(BRANCHES)), ("all", set(BRANCHES)),
    ("shared", {"shared"}), (" pool , shared ", {"pool", "shared"})])
def test_the_variable_names_the_branches(monkeypatch: pytest.MonkeyPatch, raw: str,
                                         want: set[str]) -> None:
    monkeypatch.setenv(SIDE_ENV, raw)
    assert side_branches() == want


def test_an_unknown_branch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SIDE_ENV, "shared,router")
    with pytest.raises(ValueError, match=r"\['router'\] not among shared, pool"):
        side_branches()


def test_only_decode_size_steps_take_the_side_stream() -> None:
    both = frozenset(BRANCHES)
    assert takes_side(both, "shared", 1) and takes_side(both, "pool", SIDE_TOKENS)
    assert not takes_side(both, "shared", SIDE_TOKENS + 1)
    assert not takes_side(frozenset({"pool"}), "shared", 1)
