"""Random JSON schemas of the kinds clients send (nested objects, arrays, enums, numbers,
strings, patterns), and a valid instance of each: the workload of the structured-output tests
and benchmarks. Deterministic for a seed.

Every schema is bounded (strings have a maxLength, arrays a maxItems, numbers a range, objects
no extra keys), so any output the grammar allows ends within a few hundred tokens: a
random-weight model given an unbounded string wanders inside it until max_tokens, which says
nothing about the grammar."""

from __future__ import annotations

import random
import string
from typing import Any

_WORDS = ("name", "age", "city", "items", "price", "tags", "id", "score", "valid", "kind",
          "note", "count", "owner", "level", "title", "color", "size", "email", "unit", "rank")

# Numbers with a short, exact binary fraction: a grammar library writes each enum value its own
# way (3.0 may come out "3", 9.99 as 17 digits), and these come out alike in all of them.
_NUMBERS = (0.5, 1.25, -2.75, 3.5, -0.25, 6.75, 42.5, 7.125)


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema with 1-5 properties; nested objects and arrays up to depth 2."""
    keys = rng.sample(_WORDS, rng.randint(1, 5))
    props = {k: _random_value_schema(rng, depth) for k in keys}
    required = [k for k in keys if rng.random() < 0.7] or keys[:1]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def _random_value_schema(rng: random.Random, depth: int) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "enum", "pattern"]
    if depth < 2:
        kinds += ["object", "array"]
    kind = rng.choice(kinds)
    if kind == "object":
        return random_schema(rng, depth + 1)
    if kind == "array":
        item = _random_value_schema(rng, depth + 1)
        return {"type": "array", "items": item, "minItems": rng.randint(0, 1),
                "maxItems": rng.randint(1, 4)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "small", "large", "on", "off"],
                                   rng.randint(2, 4))}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(1, 100)}
    if kind == "number":  # a range bounds the digits before the point, not after it
        return {"enum": rng.sample(_NUMBERS, 3)}
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 1), "maxLength": rng.randint(2, 12)}
    if kind == "pattern":
        return {"type": "string", "pattern": "^[a-z]{2,8}$"}
    return {"type": kind}


def random_instance(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value that validates against a schema made by `random_schema`."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        keys = [k for k in props if k in schema["required"] or rng.random() < 0.5]
        return {k: random_instance(props[k], rng) for k in keys}
    if kind == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", 3)
        return [random_instance(schema["items"], rng) for _ in range(rng.randint(lo, hi))]
    if kind == "integer":
        return rng.randint(schema["minimum"], schema["maximum"])
    if kind == "boolean":
        return rng.random() < 0.5
    if "pattern" in schema:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 8)))
    lo, hi = schema["minLength"], schema["maxLength"]
    return "".join(rng.choice(string.ascii_letters + " ") for _ in range(rng.randint(lo, hi)))


def schemas(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [random_schema(rng) for _ in range(count)]
