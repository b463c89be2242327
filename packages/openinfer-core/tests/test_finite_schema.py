"""`has_finite_instance`: False exactly when every instance must nest without end."""

from __future__ import annotations

from typing import Any

import pytest

from openinfer_core.structured.finite_schema import MAX_DEPTH, MAX_REFS, has_finite_instance

NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}},
        "required": ["next"]}


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"$defs": {"node": NODE}, "$ref": "#/$defs/node"},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"type": "array", "prefixItems": [{"$ref": "#"}], "minItems": 1},
    {"anyOf": [{"$ref": "#"}, {"allOf": [{"$ref": "#"}]}]},
    {"type": "object", "required": ["x"], "additionalProperties": {"$ref": "#"}},
    {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}},
                     "required": ["b"]},
               "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 2}},
     "$ref": "#/$defs/a"},
])
def test_no_finite_instance(schema: dict[str, Any]) -> None:
    assert not has_finite_instance(schema)


@pytest.mark.parametrize("schema", [
    {},
    {"type": "string"},
    {"type": ["object", "null"], "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"$ref": "#"}}},  # a is optional
    {"type": "array", "items": {"$ref": "#"}},  # [] is an instance
    {"anyOf": [{"$ref": "#"}, {"type": "integer"}]},
    {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#"}, {"const": 1}]}},
     "required": ["a"]},
    {"$ref": "https://example.com/remote.json"},  # not ours to follow
    {"$ref": "#/$defs/missing"},
    # A node reached twice, but not inside itself.
    {"$defs": {"leaf": {"type": "integer"}}, "type": "object",
     "properties": {"a": {"$ref": "#/$defs/leaf"}, "b": {"$ref": "#/$defs/leaf"}},
     "required": ["a", "b"]},
])
def test_finite_instance(schema: dict[str, Any]) -> None:
    assert has_finite_instance(schema)


def test_many_references_are_left_to_llguidance() -> None:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(MAX_REFS + 1)}
    defs[f"d{MAX_REFS + 1}"] = {"$ref": "#/$defs/d0"}  # a loop: no instance at all
    assert has_finite_instance({"$defs": defs, "$ref": "#/$defs/d0"})
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(MAX_REFS // 2)}
    defs[f"d{MAX_REFS // 2}"] = {"$ref": "#/$defs/d0"}
    assert not has_finite_instance({"$defs": defs, "$ref": "#/$defs/d0"})


def test_wide_schemas_cost_one_walk_per_reference() -> None:
    """Thousands of branches back to the root: answered without exploring their products."""
    assert not has_finite_instance({"anyOf": [{"$ref": "#"}] * 5_000})
    assert has_finite_instance({"anyOf": [{"$ref": "#"}] * 5_000 + [{"type": "null"}]})


def test_a_deep_schema_is_left_to_llguidance() -> None:
    """Deeper than MAX_DEPTH the answer is "finite", never a RecursionError."""
    schema: dict[str, Any] = {"$ref": "#"}
    for _ in range(MAX_DEPTH * 5):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    assert has_finite_instance(schema)
