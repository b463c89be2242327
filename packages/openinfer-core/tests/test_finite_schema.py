"""`has_finite_instance`: False exactly when every instance must nest without end."""

from __future__ import annotations

from typing import Any

import pytest

from openinfer_core.structured.finite_schema import MAX_VISITS, has_finite_instance

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


def test_a_huge_schema_is_left_to_llguidance() -> None:
    wide = {"anyOf": [{"$ref": "#"}] * (MAX_VISITS + 1)}
    assert has_finite_instance(wide)
