"""Whether a JSON schema has a finite instance: a schema whose required parts lead back to
itself (`{"properties": {"next": {"$ref": "#"}}, "required": ["next"], "type": "object"}`)
describes only infinitely nested values, and a grammar built from it lets the model write
forever without ever closing a valid value. llguidance cannot see this (it builds the grammar
lazily), so the frontend asks before it accepts such a schema.

The answer is conservative: False only when every instance would have to nest without end.
Constraints between sibling keywords (`minimum` above `maximum`, clashing `allOf` types) are
llguidance's to refuse; anything unusual (remote `$ref`s, schemas nested very deep) counts as
finite.

It is the classic "productive symbols" fixpoint, with each local `$ref` a symbol: no `$ref`
is known to have a finite instance at first; a pass over every target marks those that have
one given what is known so far; passes repeat until nothing changes. Each pass costs one walk
of the schema per `$ref`, so the whole stays linear in the schema's size times its `$ref`s."""

from __future__ import annotations

from typing import Any

# Nesting followed before a node counts as finite: llguidance refuses nesting much deeper
# than this, and a walk this deep stays far from Python's recursion limit.
MAX_DEPTH = 100
# `$ref` targets followed: a schema with more is llguidance's to judge.
MAX_REFS = 1_000

_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})


def has_finite_instance(schema: Any) -> bool:
    """False if every instance of `schema` (a decoded JSON schema) is infinitely deep."""
    refs = _local_refs(schema)
    if refs is None:
        return True
    known: set[str] = set()  # $refs whose targets have a finite instance
    while True:
        walk = _Walk(schema, known)
        grown = {ref for ref, target in refs.items()
                 if ref not in known and walk.finite(target, 0)}
        if not grown:
            return walk.finite(schema, 0)
        known |= grown


class _Walk:
    """One pass: each `$ref` is finite exactly when it is in `known`."""

    def __init__(self, root: Any, known: set[str]) -> None:
        self._root = root
        self._known = known

    def finite(self, node: Any, depth: int) -> bool:
        if depth > MAX_DEPTH or not isinstance(node, dict):
            return node is not False
        depth += 1
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and _resolve(self._root, ref) \
                is not None and ref not in self._known:
            return False
        for key in ("anyOf", "oneOf"):
            branches = node.get(key)
            if isinstance(branches, list) and branches \
                    and not any(self.finite(b, depth) for b in branches):
                return False
        branches = node.get("allOf")
        if isinstance(branches, list) and not all(self.finite(b, depth) for b in branches):
            return False
        kinds = _types(node.get("type"))
        if not kinds or kinds & _SCALARS or "enum" in node or "const" in node:
            return True  # a scalar instance ends at once
        return ("object" in kinds and self._object(node, depth)) \
            or ("array" in kinds and self._array(node, depth))

    def _object(self, node: dict[str, Any], depth: int) -> bool:
        required = node.get("required")
        if not isinstance(required, list):
            return True
        properties = node.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        extra = node.get("additionalProperties", True)
        return all(self.finite(properties.get(name, extra), depth)
                   for name in set(required) if isinstance(name, str))

    def _array(self, node: dict[str, Any], depth: int) -> bool:
        least = node.get("minItems", 0)
        if not isinstance(least, int) or least <= 0:
            return True
        prefix = node.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = node.get("items", True)
        needed = prefix[:least] + ([items] if least > len(prefix) else [])
        return all(self.finite(item, depth) for item in needed)


def _local_refs(schema: Any) -> dict[str, Any] | None:
    """Every local `$ref` in `schema` that resolves -> its target; None past MAX_REFS."""
    found: dict[str, Any] = {}
    stack = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            continue
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#") and ref not in found:
                target = _resolve(schema, ref)
                if target is not None:
                    found[ref] = target
                    if len(found) > MAX_REFS:
                        return None
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return found


def _resolve(root: Any, ref: str) -> Any:
    """A local reference ('#', '#/$defs/node') in the root schema; None otherwise."""
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _types(value: Any) -> set[str]:
    """The types a `type` keyword allows; empty when it allows any."""
    if isinstance(value, str):
        return {value}
    return {t for t in value if isinstance(t, str)} if isinstance(value, list) else set()
