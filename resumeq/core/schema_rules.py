"""The JSON Schemas a job spec carries — a tool's ``parameters``, a response format's
``schema`` — checked at enqueue, before any provider sees them: a schema no validator can
read would fail every attempt, and an answer could never be checked against it.

Three checks, each refusing with the path inside the schema (:class:`AtPath`):

- :func:`check_json_schema`: a JSON Schema by its draft's meta-schema (``$schema``, else
  draft 2020-12) — an unknown ``type``, a ``required`` that is no list of names, a ``pattern``
  that is no regular expression — and every ``$ref`` pointing at a part of the schema (no
  provider fetches another document);
- :func:`check_object_root`: a function's arguments are an object (``"type": "object"``),
  as every provider requires;
- :func:`check_strict`: with ``strict: true``, OpenAI's strict subset (its structured
  outputs guide): the root an object, every object closed (``"additionalProperties":
  false``) with every property in ``required``, all through ``properties``, ``items``,
  ``$defs`` and ``anyOf``; none of the compositions and object keywords strict mode cannot
  enforce. OpenAI's limits on size (properties in all, nesting, enum values) are left to
  it: they have changed, and its refusal names them.

Only the spec's models call these (:mod:`resumeq.core.spec_tools`): a command line's plain
spec never loads jsonschema.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from resumeq.core.spec_rules import AtPath

if TYPE_CHECKING:
    from referencing._core import Resolver  # what Registry.resolver answers

#: Keywords whose value is one subschema, a map of them, or a list of them (draft 2020-12,
#: and the older drafts' ``definitions``, ``additionalItems`` and list-valued ``items``).
_ONE = ("additionalProperties", "items", "additionalItems", "contains", "not", "if", "then",
        "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties")  # fmt: skip
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
#: Where strict mode looks for objects (OpenAI's guide: nested objects, arrays, definitions
#: and ``anyOf``).
_STRICT_ONE = ("items",)
_STRICT_MAP = ("properties", "$defs", "definitions")
_STRICT_LIST = ("anyOf",)
#: What strict mode refuses wherever it appears: the compositions it cannot constrain, and
#: the object keywords a closed object with every property required leaves no room for.
STRICT_REFUSED = ("allOf", "oneOf", "not", "if", "then", "else", "dependentRequired",
                  "dependentSchemas", "patternProperties", "unevaluatedProperties",
                  "propertyNames", "minProperties", "maxProperties")  # fmt: skip
JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_MESSAGE_MAX = 160
#: What :func:`validators.validator_for` answers for a ``$schema`` it does not know.
_UNKNOWN_DRAFT = validators.extend(Draft202012Validator)  # type: ignore[no-untyped-call]


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _subschemas(
    schema: Mapping[str, Any],
    one: tuple[str, ...] = _ONE,
    many: tuple[str, ...] = _MAP,
    listed: tuple[str, ...] = _LIST,
) -> Iterator[tuple[str, Any]]:
    """Each subschema right under ``schema`` (an object or a boolean), with its path."""
    for key in one:
        value = schema.get(key)
        if isinstance(value, dict | bool):
            yield key, value
    for key in many:
        value = schema.get(key)
        if isinstance(value, dict):
            yield from ((f"{key}.{name}", sub) for name, sub in value.items())
    for key in listed:
        value = schema.get(key)
        if isinstance(value, list):
            yield from ((f"{key}.{i}", sub) for i, sub in enumerate(value))


def _draft(schema: Mapping[str, Any]) -> type[Validator]:
    """The validator of the draft ``$schema`` names (2020-12 without one)."""
    if "$schema" not in schema:
        return Draft202012Validator
    uri = schema["$schema"]
    if not isinstance(uri, str):
        raise AtPath("$schema", "must be the URI of a JSON Schema draft, as a string")
    found = validators.validator_for(schema, default=_UNKNOWN_DRAFT)
    if found is _UNKNOWN_DRAFT:
        raise AtPath("$schema", f"names no JSON Schema draft known here ({uri[:80]!r})")
    return found


def _why(exc: SchemaError) -> AtPath:
    path = [str(p) for p in exc.path]
    if path and (path[-1] == "type" or path[-2:-1] == ["type"]):
        kinds = ", ".join(JSON_TYPES)
        return AtPath(".".join(path), f"{exc.instance!r:.60} is no JSON Schema type ({kinds})")
    message = exc.message if len(exc.message) <= _MESSAGE_MAX else exc.message[:_MESSAGE_MAX] + "…"
    return AtPath(".".join(path), f"is not a JSON Schema: {message}")


def check_json_schema(schema: Mapping[str, Any]) -> None:
    """``schema`` is a JSON Schema whose every ``$ref`` points into it, else :class:`AtPath`."""
    draft = _draft(schema)
    try:
        draft.check_schema(dict(schema))
        resource: Resource[Any] = Resource.from_contents(schema, default_specification=DRAFT202012)
        base = resource.id() or ""
        registry: Registry[Any] = Registry().with_resource(base, resource).crawl()
        _check_refs(schema, "", registry.resolver(base))
    except SchemaError as exc:
        raise _why(exc) from None
    except RecursionError:
        raise AtPath("", "nests too deep to be checked") from None


def _check_refs(schema: Any, path: str, resolver: Resolver[Any]) -> None:
    if not isinstance(schema, dict):
        return
    if path and isinstance(schema.get("$id"), str):
        resolver = resolver.in_subresource(DRAFT202012.create_resource(schema))
    ref = schema.get("$ref")
    if isinstance(ref, str):
        try:
            resolver.lookup(ref)
        except (Unresolvable, LookupError, ValueError):
            where = _join(path, "$ref")
            raise AtPath(where, f"{ref[:80]!r} points nowhere in this schema") from None
    for sub_path, sub in _subschemas(schema):
        _check_refs(sub, _join(path, sub_path), resolver)


def check_object_root(schema: Mapping[str, Any]) -> None:
    """A function's parameters: a schema of ``"type": "object"``."""
    if schema.get("type") != "object":
        got = "none" if "type" not in schema else repr(schema["type"])[:40]
        raise AtPath("type", f'must be "object": a function takes an object (got {got})')


def _is_object(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return (
        kind == "object"
        or (isinstance(kind, list) and "object" in kind)
        or ("properties" in schema)
    )


def check_strict(schema: Mapping[str, Any]) -> None:
    """OpenAI's strict subset (this module's docstring), else :class:`AtPath`."""
    if "anyOf" in schema:
        raise AtPath("anyOf", "cannot be the root with strict: the root is an object")
    if schema.get("type") != "object":
        raise AtPath("type", 'must be "object" with strict: the root is an object')
    try:
        _strict(schema, "")
    except RecursionError:
        raise AtPath("", "nests too deep to be checked") from None


def _strict(schema: Any, path: str) -> None:
    if not isinstance(schema, dict):
        return
    for key in STRICT_REFUSED:
        if key in schema:
            raise AtPath(_join(path, key), "is not supported with strict")
    if _is_object(schema):
        if schema.get("additionalProperties") is not False:
            raise AtPath(path, "additionalProperties must be false with strict")
        properties = schema.get("properties", {})
        names = set(properties) if isinstance(properties, dict) else set()
        required = schema.get("required", [])
        missing = sorted(names - set(required if isinstance(required, list) else []))
        if missing:
            listed = ", ".join(missing[:5]) + (", …" if len(missing) > 5 else "")
            raise AtPath(path, f"required must list every property with strict (not {listed})")
    for sub_path, sub in _subschemas(schema, _STRICT_ONE, _STRICT_MAP, _STRICT_LIST):
        _strict(sub, _join(path, sub_path))


def check_schema(schema: Mapping[str, Any], *, root: bool, strict: bool) -> None:
    """Every rule a spec's schema meets: a JSON Schema, an object's at the ``root`` of a
    function's parameters, and strict mode's subset where ``strict``; raises AtPath."""
    if root:
        check_object_root(schema)
    check_json_schema(schema)
    if strict:
        check_strict(schema)
