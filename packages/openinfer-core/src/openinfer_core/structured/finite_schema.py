"""Whether a JSON schema has a finite instance: a schema whose required parts lead back to
itself (`{"properties": {"next": {"$ref": "#"}}, "required": ["next"], "type": "object"}`)
describes only infinitely nested values, and a grammar built from it lets the model write
forever without ever closing a valid value. llguidance cannot see this (it builds the grammar
lazily), so the frontend asks before it accepts such a schema.

The answer is conservative: False only when every instance would have to nest without end.
Constraints between sibling keywords (`minimum` above `maximum`, clashing `allOf` types) are
llguidance's to refuse; anything unusual (remote `$ref`s, very large schemas) counts as
finite."""

from __future__ import annotations

from typing import Any

# Schema nodes visited before the answer is "finite" by default: a check is meant to cost
# microseconds, and a schema this large is llguidance's to judge.
MAX_VISITS = 20_000

_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})


def has_finite_instance(schema: Any) -> bool:
    """False if every instance of `schema` (a decoded JSON schema) is infinitely deep."""
    return _Search(schema).finite(schema, frozenset())


class _Search:
    def __init__(self, root: Any) -> None:
        self._root = root
        self._visits = 0

    def finite(self, node: Any, refs: frozenset[str]) -> bool:
        """`refs`: the `$ref`s being expanded on the way here; meeting one again is a loop,
        and a loop on every way to an instance means no finite one."""
        self._visits += 1
        if self._visits > MAX_VISITS or not isinstance(node, dict):
            return node is not False
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in refs:
                return False
            target = self._resolve(ref)
            if target is not None and not self.finite(target, refs | {ref}):
                return False
        for key in ("anyOf", "oneOf"):
            branches = node.get(key)
            if isinstance(branches, list) and branches \
                    and not any(self.finite(b, refs) for b in branches):
                return False
        branches = node.get("allOf")
        if isinstance(branches, list) and not all(self.finite(b, refs) for b in branches):
            return False
        kinds = _types(node.get("type"))
        if not kinds or kinds & _SCALARS or "enum" in node or "const" in node:
            return True  # a scalar instance ends at once
        return ("object" in kinds and self._object(node, refs)) \
            or ("array" in kinds and self._array(node, refs))

    def _object(self, node: dict[str, Any], refs: frozenset[str]) -> bool:
        required = node.get("required")
        if not isinstance(required, list):
            return True
        properties = node.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        extra = node.get("additionalProperties", True)
        return all(self.finite(properties.get(name, extra), refs)
                   for name in required if isinstance(name, str))

    def _array(self, node: dict[str, Any], refs: frozenset[str]) -> bool:
        least = node.get("minItems", 0)
        if not isinstance(least, int) or least <= 0:
            return True
        prefix = node.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        items = node.get("items", True)
        needed = prefix[:least] + ([items] if least > len(prefix) else [])
        return all(self.finite(item, refs) for item in needed)

    def _resolve(self, ref: str) -> Any:
        """A local reference ('#', '#/$defs/node') in the root schema; None otherwise."""
        if not ref.startswith("#"):
            return None
        node = self._root
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
