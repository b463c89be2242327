"""Structured output in the engine: the device bitmask, grammars compiled off the step loop,
masked rows beside free ones in one batch, both step loops, aborts while compiling, and
specs the frontend would have refused reaching the engine anyway."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import jsonschema
import pytest
import torch
from engine_helpers import finished_of, run_staggered, tokens_of

from openinfer_core import Engine, EngineConfig, GenerateRequest, SamplingParams
from openinfer_core.errors import InvalidParameterError
from openinfer_core.events import Finished, FinishReason, Rejected, Token
from openinfer_core.params import StructuredOutput
from openinfer_core.sampling.token_mask import TokenMask, apply_token_mask
from openinfer_core.structured.grammar import GrammarCompiler, check
from openinfer_core.text.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "n"], "additionalProperties": False}


def bits_allowing(allowed: list[list[int]], vocab: int) -> torch.Tensor:
    words = -(-vocab // 32)
    out = torch.zeros((len(allowed), words), dtype=torch.int64)
    for r, ids in enumerate(allowed):
        for t in ids:
            out[r, t // 32] |= 1 << (t % 32)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)  # bit 31: the sign


def test_apply_token_mask_keeps_only_the_allowed_ids() -> None:
    vocab = 70  # not a multiple of 32: the last word's high bits are past the vocabulary
    logits = torch.randn(4, vocab)
    before = logits.clone()
    allowed = [[0, 31, 69], [], [32, 63]]  # row 1 of the mask allows nothing
    mask = TokenMask(torch.tensor([0, 1, 3]), bits_allowing(allowed, vocab))
    apply_token_mask(logits, mask)
    for row, ids in ((0, allowed[0]), (3, allowed[2])):
        finite = torch.isfinite(logits[row]).nonzero().flatten().tolist()
        assert finite == ids
        assert torch.equal(logits[row, ids], before[row, ids])
    assert torch.equal(logits[1], before[1])  # allows nothing: left alone
    assert torch.equal(logits[2], before[2])  # not a masked row


@pytest.mark.parametrize(("spec", "param"), [
    (StructuredOutput("json", '{"type": "object", "properties": {"a": {"type": "nope"}}}'),
     "json_schema"),
    (StructuredOutput("json", "[1, 2"), "json_schema"),
    (StructuredOutput("regex", "a(b"), "regex"),
    (StructuredOutput("grammar", "start: missing_rule"), "grammar"),
    (StructuredOutput("choice", "[]"), "choice"),
])
def test_check_names_the_field(spec: StructuredOutput, param: str) -> None:
    with pytest.raises(InvalidParameterError) as info:
        check(spec)
    assert info.value.param == param


@pytest.mark.parametrize(("spec", "needle"), [
    (StructuredOutput("regex", "a{1000000}"), "too large"),
    (StructuredOutput("regex", "((a{100}){100}){100}"), "too large"),
    (StructuredOutput("grammar", "start: " + " | ".join(f'"w{i}"' for i in range(3000))),
     "too large"),
    (StructuredOutput("grammar", "start: start"), "admits no string"),
    (StructuredOutput("json", '{"$ref": "#"}'), "admits no finite JSON value"),
    (StructuredOutput("json", '{"type": "object", "properties": {"a": {"$ref": "#"}}, '
                              '"required": ["a"]}'), "admits no finite JSON value"),
])
def test_check_refuses_grammars_no_request_can_satisfy(spec: StructuredOutput,
                                                        needle: str) -> None:
    with pytest.raises(InvalidParameterError, match=needle) as info:
        check(spec)
    assert info.value.param in ("regex", "grammar", "json_schema")


@pytest.mark.parametrize("spec", [
    StructuredOutput("regex", ""),  # admits the empty string
    StructuredOutput("regex", "a{1000}"),
    StructuredOutput("grammar", 'start: "x" a | "y"\na: a'),  # a dead branch, a live one
    StructuredOutput("json", '{"type": "object", "properties": {"next": {"anyOf": '
                             '[{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]}'),
    StructuredOutput("json", '{"type": "array", "items": {"$ref": "#"}}'),  # [] ends it
    StructuredOutput("json_object"),
])
def test_check_accepts_grammars_with_a_way_out(spec: StructuredOutput) -> None:
    check(spec)


def test_compiler_caches_by_spec_and_hands_out_fresh_matchers(qwen3_dir: Path) -> None:
    tok = Tokenizer.from_dir(qwen3_dir)
    compiler = GrammarCompiler((qwen3_dir / "tokenizer.json").read_text(), tok.vocab_size, [])
    spec = StructuredOutput("regex", "(yes|no)")
    first = compiler.compile(spec)
    yes = tok.encode("yes", add_special_tokens=False)
    assert all(first.consume_token(t) for t in yes)
    second = compiler.compile(spec)  # from the cache, at the start again
    assert len(compiler._cache) == 1
    assert second.consume_tokens(tok.encode("no", add_special_tokens=False))
    assert not second.is_error()


def structured(i: int, kind: str, spec: str, *, temperature: float = 1.0,
               max_tokens: int = 96) -> GenerateRequest:
    return GenerateRequest(f"s{i}", (9707, 25, 220 + i), SamplingParams(
        temperature=temperature, seed=i, max_tokens=max_tokens,
        structured=StructuredOutput(kind, spec)))


def free(i: int) -> GenerateRequest:
    return GenerateRequest(f"f{i}", (9707, 25, 300 + i), SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True))


@pytest.mark.parametrize("overlap", [True, False], ids=["overlapped", "plain"])
def test_masked_and_free_rows_share_batches(qwen3_dir: Path, overlap: bool) -> None:
    """Constrained rows all end valid; free rows beside them are exactly what they are
    alone (the mask touches only its rows)."""
    tok = Tokenizer.from_dir(qwen3_dir)
    alone = Engine(EngineConfig(model=str(qwen3_dir), device="cpu",
                                async_scheduling=overlap))
    free_alone = run_staggered(alone, [free(i) for i in range(3)], lambda i: 0)
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu", async_scheduling=overlap))
    requests = [structured(i, "json", json.dumps(SCHEMA)) for i in range(4)]
    requests += [structured(10, "regex", "[a-c]{2}-[0-9]{3}"),
                 structured(11, "choice", json.dumps(["left", "right"]), temperature=0.0),
                 structured(12, "grammar", 'start: "x" ("+" "x")* ";"')]
    requests += [free(i) for i in range(3)]
    events = run_staggered(engine, requests, lambda i: i % 3)
    texts = {r.request_id: tok.decode(tokens_of(events[r.request_id])) for r in requests}
    for i in range(4):
        assert finished_of(events[f"s{i}"]).reason == FinishReason.STOP, texts[f"s{i}"]
        jsonschema.validate(json.loads(texts[f"s{i}"]), SCHEMA)
    assert re.fullmatch("[a-c]{2}-[0-9]{3}", texts["s10"])
    assert texts["s11"] in ("left", "right")
    assert re.fullmatch(r"x(\+x)*;", texts["s12"])
    for i in range(3):
        assert tokens_of(events[f"f{i}"]) == tokens_of(free_alone[f"f{i}"])
    assert engine.kv.num_used_blocks == 0
    assert not engine.has_work()


def test_abort_while_compiling_and_bad_specs(qwen3_dir: Path) -> None:
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
    engine.add_request(structured(0, "json", json.dumps(SCHEMA)))
    engine.abort("s0")  # before its grammar is ready: never reaches the scheduler
    bad = structured(1, "regex", "a(b")  # the frontend would have refused it
    engine.add_request(bad)
    seen: list = []
    while engine.has_work():
        seen += engine.step()
    assert [type(e) for e in seen if e.request_id == "s0"] == [Finished]
    assert next(e for e in seen if e.request_id == "s0").reason == FinishReason.ABORT
    refusal = [e for e in seen if e.request_id == "s1"]
    assert len(refusal) == 1 and isinstance(refusal[0], Rejected)
    assert "regex" in refusal[0].message
    assert not any(isinstance(e, Token) for e in seen)
    assert engine.kv.num_used_blocks == 0


def test_a_held_compile_holds_back_only_its_request(qwen3_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """While one grammar's compile is stuck, other requests run to the end; the stuck one
    runs once its compile returns."""
    release = threading.Event()
    original = GrammarCompiler.compile

    def held(self: GrammarCompiler, spec: StructuredOutput):  # type: ignore[no-untyped-def]
        assert release.wait(60)
        return original(self, spec)

    monkeypatch.setattr(GrammarCompiler, "compile", held)
    engine = Engine(EngineConfig(model=str(qwen3_dir), device="cpu"))
    engine.add_request(structured(0, "regex", "(yes|no)"))
    for i in range(3):
        engine.add_request(free(i))
    ended: set[str] = set()
    for _ in range(200):
        ended |= {e.request_id for e in engine.step() if isinstance(e, Finished)}
        if ended >= {"f0", "f1", "f2"}:
            break
    assert ended == {"f0", "f1", "f2"}  # all free ones done, the held one not
    release.set()
    events: list = []
    while engine.has_work():
        events += engine.step()
    tok = Tokenizer.from_dir(qwen3_dir)
    assert tok.decode([e.token_id for e in events if isinstance(e, Token)]) in ("yes", "no")
    assert [e.reason for e in events if isinstance(e, Finished)] == [FinishReason.STOP]
