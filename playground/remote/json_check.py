"""A JSON value checked against a JSON schema, as JSON Schema reads it (keys in any order, extra keys allowed unless
``additionalProperties`` says otherwise): the check of a server's reply, which llguidance's schema grammar cannot
be (it fixes the keys' order to the schema's, where llama-server's converter writes required keys first).

The common keywords of draft 2020-12 (and draft 7's ``definitions`` / list ``items``): ``type``, ``enum``, ``const``,
``properties``, ``required``, ``additionalProperties``, ``patternProperties``, ``items``, ``prefixItems``,
``minItems``/``maxItems``, ``uniqueItems``, ``minLength``/``maxLength``, ``pattern``, ``minimum``/``maximum`` and their
exclusive forms, ``multipleOf``, ``anyOf``/``oneOf``/``allOf``/``not``, local ``$ref``; annotations (``title``,
``format``, ...) are not checked. A schema with any other keyword raises ``Unchecked``: the caller asks llguidance.
"""

from __future__ import annotations

import json
import re
from typing import Any

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "format", "$schema", "$id", "$comment",
                         "$defs", "definitions", "deprecated", "readOnly", "writeOnly", "contentMediaType",
                         "contentEncoding"})
CHECKED = frozenset({"type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
                     "items", "prefixItems", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength",
                     "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "anyOf",
                     "oneOf", "allOf", "not", "$ref", "additionalItems"})


class Unchecked(ValueError):
    """The schema uses a keyword this check does not read."""


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float)
                                                                            and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    types = {"string": str, "object": dict, "array": list, "boolean": bool, "null": type(None)}
    if kind not in types:
        raise Unchecked(f"type {kind!r}")
    return isinstance(value, types[kind])


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        raise Unchecked(f"$ref {ref!r} (not local)")
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise Unchecked(f"$ref {ref!r} (not found)")
    return node


def problem(value: Any, schema: Any, root: Any = None, path: str = "$") -> str:
    """"" when ``value`` validates against ``schema``, else the first failure with its JSON path; ``Unchecked``
    for a keyword not read here."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return ""
    if schema is False:
        return f"{path}: the schema allows nothing here"
    if not isinstance(schema, dict):
        raise Unchecked("a schema that is not an object")
    unknown = set(schema) - CHECKED - ANNOTATIONS
    if unknown:
        raise Unchecked(", ".join(sorted(unknown)))
    if "$ref" in schema:
        found = problem(value, _resolve(root, schema["$ref"]), root, path)
        if found:
            return found
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is_type(value, k) for k in kinds):
            return f"{path}: {json.dumps(value)[:40]} is not of type {'/'.join(kinds)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {json.dumps(value)[:40]} is none of the enum's values"
    if "const" in schema and value != schema["const"]:
        return f"{path}: {json.dumps(value)[:40]} is not the const {json.dumps(schema['const'])[:40]}"
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            failures = [problem(value, sub, root, path) for sub in schema[key]]
            passed = sum(not f for f in failures)
            if key == "allOf" and passed < len(failures):
                return next(f for f in failures if f)
            if key == "anyOf" and not passed:
                return f"{path}: matches none of anyOf ({failures[0]})"
            if key == "oneOf" and passed != 1:
                return f"{path}: matches {passed} of oneOf's schemas, not exactly one"
    if "not" in schema and not problem(value, schema["not"], root, path):
        return f"{path}: matches the schema under 'not'"
    if isinstance(value, dict):
        return _object(value, schema, root, path)
    if isinstance(value, list):
        return _array(value, schema, root, path)
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            return f"{path}: a string of {len(value)} characters is outside minLength/maxLength"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return f"{path}: {value[:40]!r} does not match the pattern {schema['pattern']!r}"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        bounds = (("minimum", lambda b: value < b), ("maximum", lambda b: value > b),
                  ("exclusiveMinimum", lambda b: value <= b), ("exclusiveMaximum", lambda b: value >= b),
                  ("multipleOf", lambda b: (value / b) % 1 != 0))
        for key, breaks in bounds:
            if key in schema and breaks(schema[key]):
                return f"{path}: {value} breaks {key} {schema[key]}"
    return ""


def _object(value: dict, schema: dict, root: Any, path: str) -> str:
    for key in schema.get("required", ()):
        if key not in value:
            return f"{path}: the required key {key!r} is missing"
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    for key, item in value.items():
        subs = [properties[key]] if key in properties else []
        subs += [sub for pattern, sub in patterns.items() if re.search(pattern, key)]
        if not subs:
            subs = [schema.get("additionalProperties", True)]
            if subs[0] is False:
                return f"{path}: the key {key!r} is not allowed (additionalProperties: false)"
        for sub in subs:
            found = problem(item, sub, root, f"{path}.{key}")
            if found:
                return found
    return ""


def _array(value: list, schema: dict, root: Any, path: str) -> str:
    if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
        return f"{path}: an array of {len(value)} items is outside minItems/maxItems"
    if schema.get("uniqueItems") and len({json.dumps(v, sort_keys=True) for v in value}) < len(value):
        return f"{path}: its items are not unique"
    items = schema.get("items", True)
    prefix = schema.get("prefixItems", items if isinstance(items, list) else [])
    rest = items if not isinstance(items, list) else schema.get("additionalItems", True)
    for i, item in enumerate(value):
        found = problem(item, prefix[i] if i < len(prefix) else rest, root, f"{path}[{i}]")
        if found:
            return found
    return ""
