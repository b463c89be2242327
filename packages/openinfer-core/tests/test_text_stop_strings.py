from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openinfer_core.errors import InvalidParameterError
from openinfer_core.text.stop_strings import StopStringMatcher


def _run(matcher: StopStringMatcher, deltas: list[str]) -> tuple[list[str], bool]:
    """Feed deltas until a stop; return what was emitted per call (flush included) and
    whether a stop string was hit."""
    out: list[str] = []
    for delta in deltas:
        text, hit = matcher.feed(delta)
        out.append(text)
        if hit:
            return out, True
    out.append(matcher.flush())
    return out, False


def test_stop_string_split_across_deltas_is_never_emitted() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("hello S") == ("hello ", False)
    assert matcher.feed("T") == ("", False)
    assert matcher.feed("OP and more") == ("", True)
    assert matcher.stopped


def test_include_stop_str_in_output() -> None:
    matcher = StopStringMatcher(["</answer>"], include_stop_str_in_output=True)
    assert matcher.feed("42</ans") == ("42", False)
    assert matcher.feed("wer> trailing") == ("</answer>", True)


def test_false_start_is_released() -> None:
    matcher = StopStringMatcher(["\n\nUser:"])
    assert matcher.feed("line\n") == ("line", False)
    assert matcher.feed("\nUs") == ("", False)
    assert matcher.feed("ed to") == ("\n\nUsed to", False)


def test_flush_releases_held_tail_at_end() -> None:
    matcher = StopStringMatcher(["###"])
    assert matcher.feed("total: 3 #") == ("total: 3 ", False)
    assert matcher.feed("#") == ("", False)
    assert matcher.flush() == "##"
    assert matcher.flush() == ""


def test_stop_string_that_completes_first_wins() -> None:
    # "b" completes before "abc" would, whichever way the text arrives.
    assert _run(StopStringMatcher(["abc", "b"]), ["xabc"]) == (["xa"], True)
    assert _run(StopStringMatcher(["abc", "b"]), ["xa", "bc"]) == (["x", "a"], True)


def test_tie_on_end_prefers_the_longer_stop() -> None:
    assert _run(StopStringMatcher(["bc", "abc"]), ["xxabcyy"]) == (["xx"], True)


def test_after_stop_feed_returns_nothing() -> None:
    matcher = StopStringMatcher(["."])
    assert matcher.feed("a.b") == ("a", True)
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_no_stop_strings_passes_text_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.feed("abc") == ("abc", False)
    assert matcher.flush() == ""


def test_a_bare_string_is_one_stop_string() -> None:
    assert StopStringMatcher("ab").feed("xaby") == ("x", True)


@pytest.mark.parametrize("bad", [[""], ["ok", ""], [3]])
def test_bad_stop_strings_are_rejected(bad: list[object]) -> None:
    with pytest.raises(InvalidParameterError) as info:
        StopStringMatcher(bad)  # type: ignore[arg-type]
    assert info.value.param == "stop"


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc\n", max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=6),
    stops=st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), min_size=1, max_size=3),
    include=st.booleans(),
)
def test_result_does_not_depend_on_how_text_is_chunked(
    text: str, cuts: list[int], stops: list[str], include: bool
) -> None:
    bounds = [0, *sorted(c for c in cuts if c <= len(text)), len(text)]
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    whole, whole_hit = _run(StopStringMatcher(stops, include_stop_str_in_output=include), [text])
    parts, parts_hit = _run(StopStringMatcher(stops, include_stop_str_in_output=include), deltas)
    assert "".join(parts) == "".join(whole)
    assert parts_hit == whole_hit
    # Oracle: cut at the stop string that ends earliest (longest on a tie).
    ends = [(text.find(s) + len(s), -len(s)) for s in stops if s in text]
    if ends:
        end, neg_len = min(ends)
        assert "".join(whole) == (text[:end] if include else text[: end + neg_len])
    else:
        assert "".join(whole) == text
