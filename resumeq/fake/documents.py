"""JSON the fake writes: a tool call's arguments and a structured answer's document, each a
deterministic function of a seed and a JSON Schema, valid against it, and the tokens it is
sent in.

The value follows the schema: ``object`` (``properties`` in order, every one filled, required
or not; ``additionalProperties`` — false: nothing more; a schema or absent, on an object
without ``properties``: a few keys of its own; ``minProperties``/``maxProperties``),
``array`` (``items``, ``minItems``/``maxItems``, ``uniqueItems``), ``string`` (``enum``,
``const``, ``minLength``/``maxLength``, ``format`` date, date-time, time, email, uri, uuid),
``integer``/``number`` (``minimum``/``maximum``, exclusive too, ``multipleOf`` for integers),
``boolean``, ``null``; a list of types takes its first that is not ``null``; ``anyOf`` and
``oneOf`` their first branch, ``allOf`` its branches merged; ``$ref`` to ``#/$defs/...`` or
``#/definitions/...`` (any JSON pointer into the schema). Past a depth of
:data:`MAX_DEPTH` an object holds only its required properties and an array its
``minItems``, so a recursive schema ends. ``pattern`` is not followed.

Strings are a few words of English, now and then odd Unicode (accents, CJK, an emoji, a
quote or a backslash that JSON escapes), sized so that the whole text is about ``low`` to
``high`` tokens when the schema leaves room for it (arguments: 30 to 200, documents: 50 to
500). The text is compact JSON (``separators=(",", ":")``, ``ensure_ascii=False``), cut into
pieces of 1 to 4 characters roughly as a BPE tokenizer would (:func:`json_tokens`): one
piece, one output token.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import random
import re
import uuid
from collections.abc import Mapping
from typing import Any

#: How deep a value nests before objects and arrays hold only what they must.
MAX_DEPTH = 6
#: Token ranges aimed at (when the schema leaves room).
ARGUMENT_TOKENS = (30, 200)
DOCUMENT_TOKENS = (50, 500)

_WORDS = (
    *("account", "address", "after", "amber", "answer", "april", "area", "autumn", "basket"),
    *("battery", "before", "bridge", "bright", "budget", "cabin", "calm", "candle", "canyon"),
    *("carbon", "castle", "centre", "change", "city", "clear", "cloud", "coastal", "copper"),
    *("corner", "cotton", "county", "crisp", "current", "daily", "delivery", "desert"),
    *("detail", "early", "eastern", "engine", "evening", "field", "filter", "final", "forest"),
    *("fresh", "garden", "gentle", "glass", "golden", "granite", "green", "harbour", "heavy"),
    *("highway", "island", "journey", "kitchen", "lantern", "late", "level", "light", "linen"),
    *("local", "market", "meadow", "metal", "middle", "morning", "motion", "mountain", "night"),
    *("north", "number", "ocean", "office", "orange", "order", "paper", "pattern", "quiet"),
    *("rapid", "record", "region", "report", "river", "rough", "route", "salt", "season"),
    *("signal", "silver", "simple", "small", "south", "station", "steady", "stone", "storm"),
    *("street", "summer", "supply", "table", "thin", "timber", "total", "tower", "travel"),
    *("valley", "velvet", "warm", "water", "western", "window", "winter", "yellow", "young"),
)
_ODD = (
    *("café", "naïve", "Zürich", "São Paulo", "straße", "façade", "Ångström", "東京", "Ελλάδα"),
    *("Москва", "🚀", "—", "“quoted”", 'say "hi"', "back\\slash", "½ price", "résumé", "日本語"),
)
_KEY_WORDS = ("note", "label", "detail", "summary", "count", "status", "region", "owner")
_FORMATS = {
    "date": lambda rng: _date(rng).isoformat(),
    "date-time": lambda rng: f"{_date(rng).isoformat()}T{_time(rng)}Z",
    "time": lambda rng: f"{_time(rng)}Z",
    "email": lambda rng: f"{_pick(rng, _WORDS)}.{_pick(rng, _WORDS)}@example.org",
    "uri": lambda rng: f"https://example.org/{_pick(rng, _WORDS)}/{_pick(rng, _WORDS)}",
    "uuid": lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
}

# Words with their leading space, runs of up to three digits, one character outside ASCII,
# runs of white space, runs of ASCII punctuation (JSON's structure and escapes), anything else.
_PRE_RE = re.compile(r" ?[A-Za-z]+| ?[0-9]{1,3}|[^\x00-\x7f]|\s+|[!-/:-@\[-`{-~]+|.", re.S)
MAX_PIECE = 4


def json_tokens(text: str) -> tuple[str, ...]:
    """``text`` as the fake's output tokens: pieces of 1 to 4 characters that join to it."""
    pieces: list[str] = []
    for match in _PRE_RE.finditer(text):
        run = match.group(0)
        count = -(-len(run) // MAX_PIECE)  # as even pieces as the run allows
        size, extra = divmod(len(run), count)
        start = 0
        for index in range(count):
            end = start + size + (1 if index < extra else 0)
            pieces.append(run[start:end])
            start = end
    return tuple(pieces)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def schema_key(schema: Mapping[str, Any] | None) -> str:
    """A schema as one string (what seeds and caches are keyed by). Its keys keep their
    order: the properties of a value come in the order the schema gives them."""
    return json.dumps(schema, ensure_ascii=False)


def arguments_tokens(seed: bytes, name: str, parameters: Mapping[str, Any]) -> tuple[str, ...]:
    """A call's arguments to tool ``name``: of the seed, the name and the schema only."""
    return _sized(
        _derive(seed, b"tool", name, schema_key(parameters)),
        schema_key(parameters),
        *ARGUMENT_TOKENS,
    )


def document_tokens(seed: bytes, schema: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The structured answer: valid for ``schema``, or (None: ``json_object``) any object."""
    key = schema_key(schema if schema is not None else {"type": "object"})
    return _sized(_derive(seed, b"document", key), key, *DOCUMENT_TOKENS)


def _derive(seed: bytes, *parts: bytes | str) -> bytes:
    digest = hashlib.sha256(seed)
    for part in parts:
        data = part.encode("utf-8") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.digest()


#: Word counts tried in turn, scaled from each string's own, until the text fits its range.
_SCALES = (1.0, 0.5, 2.0, 0.25, 4.0, 0.1, 8.0)


@functools.lru_cache(maxsize=256)
def _sized(seed: bytes, key: str, low: int, high: int) -> tuple[str, ...]:
    schema = json.loads(key)
    best: tuple[str, ...] | None = None
    for scale in _SCALES:
        tokens = json_tokens(dumps(_Filler(seed, schema, scale).value(schema, 0)))
        if low <= len(tokens) <= high:
            return tokens
        if best is None or _miss(len(tokens), low, high) < _miss(len(best), low, high):
            best = tokens
    assert best is not None
    return best


def _miss(count: int, low: int, high: int) -> int:
    return low - count if count < low else max(0, count - high)


def _pick(rng: random.Random, options: tuple[str, ...]) -> str:
    return options[rng.randrange(len(options))]


def _date(rng: random.Random) -> datetime.date:
    return datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randrange(2500))


def _time(rng: random.Random) -> str:
    return f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"


class _Filler:
    """Values for one schema, drawn in a fixed order from one seeded generator."""

    def __init__(self, seed: bytes, root: Any, scale: float) -> None:
        self.rng = random.Random(seed)
        self.root = root
        self.scale = scale

    def value(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, Mapping):  # ``true`` (anything) or a stray value
            return self.words()
        schema = self.resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][self.rng.randrange(len(schema["enum"]))]
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                return self.value(branches[0], depth)
        return self.typed(schema, depth)

    def typed(self, schema: Mapping[str, Any], depth: int) -> Any:
        kind = _kind(schema)
        if kind == "object":
            return self.object(schema, depth)
        if kind == "array":
            return self.array(schema, depth)
        if kind in ("integer", "number"):
            return self.number(schema, integer=kind == "integer")
        if kind in ("boolean", "null"):
            return self.rng.random() < 0.5 if kind == "boolean" else None
        return self.string(schema)

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        """``schema`` with its ``$ref`` followed and its ``allOf`` merged in."""
        seen = 0
        while isinstance(schema.get("$ref"), str) and seen < 32:
            target = _pointer(self.root, schema["$ref"])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest} if isinstance(target, Mapping) else rest
            seen += 1
        branches = schema.get("allOf")
        if not isinstance(branches, list):
            return schema
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for branch in branches:
            if isinstance(branch, Mapping):
                _merge(merged, self.resolve(branch))
        return merged

    def object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        required = set(schema.get("required") or ())
        out: dict[str, Any] = {}
        if isinstance(properties, Mapping) and properties:
            for name, sub in properties.items():
                if depth < MAX_DEPTH or name in required:
                    out[name] = self.value(sub, depth + 1)
            return out
        extra = schema.get("additionalProperties", True)
        if extra is False:
            return out
        low = int(schema.get("minProperties", 0))
        high = int(schema.get("maxProperties", max(low, 4)))
        count = 0 if depth >= MAX_DEPTH else min(high, max(low, 2 + self.rng.randrange(3)))
        count = max(count, low)
        for index in range(count):
            key = f"{_pick(self.rng, _KEY_WORDS)}_{index + 1}"
            out[key] = self.value(extra, depth + 1) if isinstance(extra, Mapping) else self.free()
        return out

    def free(self) -> Any:
        """A value for a key no schema describes."""
        choice = self.rng.randrange(4)
        if choice == 0:
            return self.rng.randrange(1000)
        if choice == 1:
            return [self.words() for _ in range(1 + self.rng.randrange(3))]
        return self.words()

    def array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        low = int(schema.get("minItems", 0))
        high = schema.get("maxItems")
        count = max(low, 1 + self.rng.randrange(3)) if depth < MAX_DEPTH else low
        if isinstance(high, int):
            count = min(count, high)
        items = schema.get("items", {})
        unique = schema.get("uniqueItems") is True
        out: list[Any] = []
        for _ in range(count * 8 if unique else count):
            item = self.value(items, depth + 1)
            if not (unique and item in out):
                out.append(item)
            if len(out) == count:
                break
        return out

    def number(self, schema: Mapping[str, Any], *, integer: bool) -> int | float:
        low, high = _bounds(schema, 1 if integer else 0.01)
        if integer:
            first, last = int(-(-low // 1)), int(high // 1)
            multiple = schema.get("multipleOf")
            if isinstance(multiple, int) and multiple > 0:
                first, last = -(-first // multiple), last // multiple
                return multiple * (first + self.rng.randrange(max(last - first + 1, 1)))
            return first + self.rng.randrange(max(last - first + 1, 1))
        value = round(low + (high - low) * self.rng.random(), 2)
        return min(max(value, low), high)

    def string(self, schema: Mapping[str, Any]) -> str:
        make = _FORMATS.get(str(schema.get("format")))
        text = make(self.rng) if make is not None else self.words()
        low, high = schema.get("minLength"), schema.get("maxLength")
        while isinstance(low, int) and len(text) < low:
            text += " " + _pick(self.rng, _WORDS)
        if isinstance(high, int) and len(text) > high:
            text = text[:high]
        return text

    def words(self) -> str:
        count = max(1, round((3 + self.rng.randrange(10)) * self.scale))
        words = [
            _pick(self.rng, _ODD) if self.rng.randrange(9) == 0 else _pick(self.rng, _WORDS)
            for _ in range(count)
        ]
        return " ".join(words).capitalize() if words[0].isascii() else " ".join(words)


def _bounds(schema: Mapping[str, Any], step: float) -> tuple[float, float]:
    """The range a number is drawn from: the schema's bounds (exclusive ones a step in),
    a thousand wide where it gives one or none."""
    given: list[float | None] = []
    for inclusive, exclusive, inward in (
        ("minimum", "exclusiveMinimum", step),
        ("maximum", "exclusiveMaximum", -step),
    ):
        bound, strict = schema.get(inclusive), schema.get(exclusive)
        bound = bound if isinstance(bound, int | float) and not isinstance(bound, bool) else None
        if isinstance(strict, int | float) and not isinstance(strict, bool):
            inner = strict + inward
            bound = inner if bound is None else (max if inward > 0 else min)(bound, inner)
        given.append(bound)
    low, high = given
    if low is None and high is None:
        return 0, 1000
    if low is None:
        assert high is not None
        return high - 1000, high
    return low, high if high is not None else low + 1000


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _pointer(root: Any, ref: str) -> Any:
    """The part of ``root`` a local ``$ref`` (``#/$defs/Name``) points to ({} if none)."""
    if not ref.startswith("#"):
        return {}
    node = root
    for raw in ref[1:].split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return {}
    return node


def _merge(into: dict[str, Any], branch: Mapping[str, Any]) -> None:
    for key, value in branch.items():
        if key == "properties" and isinstance(value, Mapping):
            into["properties"] = {**into.get("properties", {}), **value}
        elif key == "required" and isinstance(value, list):
            into["required"] = [*into.get("required", []), *value]
        else:
            into.setdefault(key, value)
