"""The JSON the fake writes for a schema (tool arguments, structured answers) and the tokens it
sends it in: valid, deterministic, sized, and cut the way a BPE tokenizer roughly would."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from resumeq.fake.conversation import SCHEMA_NOTE, conversation_of, split_note
from resumeq.fake.documents import arguments_tokens, document_tokens, json_tokens
from resumeq.fake.plan import plan
from resumeq.fake.shape import Shape, ToolDef

pytestmark = pytest.mark.timeout(30)

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
SEEDS = [bytes([n]) * 32 for n in range(6)]

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 40},
            "age": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 120},
            "score": {"type": "number", "minimum": -1.5, "maximum": 1.5},
            "step": {"type": "integer", "minimum": 3, "maximum": 97, "multipleOf": 7},
            "ok": {"type": "boolean"},
            "nothing": {"type": "null"},
            "mode": {"const": "fast"},
            "level": {"enum": [1, "two", None]},
        },
        "required": ["name"],
        "additionalProperties": False,
    },
    "formats": {
        "type": "object",
        "properties": {
            kind: {"type": "string", "format": kind}
            for kind in ("date", "date-time", "time", "email", "uri", "uuid")
        },
    },
    "unions": {
        "type": "object",
        "properties": {
            "maybe": {"type": ["null", "string"]},
            "either": {"oneOf": [{"type": "integer", "minimum": 5}, {"type": "string"}]},
            "merged": {
                "allOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                    {"properties": {"b": {"type": "integer"}}, "required": ["b"]},
                ],
            },
        },
    },
    "references": {
        "definitions": {
            "Point": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
        },
        "$defs": {
            "Tree": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
                    "at": {"$ref": "#/definitions/Point"},
                },
                "required": ["label", "children"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/Tree",
    },
    "free": {
        "type": "object",
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
        "minProperties": 3,
    },
    "arrays": {
        "type": "array",
        "items": {"type": "string", "enum": ["a", "b", "c", "d"]},
        "minItems": 3,
        "uniqueItems": True,
    },
    "scalar": {"type": "string"},
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_values_are_valid_for_their_schema_and_deterministic(name: str) -> None:
    schema = SCHEMAS[name]
    texts = set()
    for seed in SEEDS:
        for tokens in (arguments_tokens(seed, "tool", schema), document_tokens(seed, schema)):
            text = "".join(tokens)
            jsonschema.validate(json.loads(text), schema, format_checker=CHECKER)
            assert text == json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
            texts.add(text)
        assert arguments_tokens(seed, "tool", schema) == arguments_tokens(seed, "tool", schema)
    assert len(texts) > len(SEEDS)  # the seed and the size asked for change the value


def test_every_property_is_filled_in_the_schemas_order() -> None:
    schema = SCHEMAS["flat"]
    value = json.loads("".join(arguments_tokens(SEEDS[0], "tool", schema)))
    assert list(value) == list(schema["properties"])


def test_sizes_aim_at_their_ranges_where_the_schema_leaves_room() -> None:
    schema = {
        "type": "object",
        "properties": {"note": {"type": "string"}, "more": {"type": "string"}},
    }
    for seed in SEEDS:
        assert 30 <= len(arguments_tokens(seed, "tool", schema)) <= 200
        assert 50 <= len(document_tokens(seed, schema)) <= 500
        assert 50 <= len(document_tokens(seed, None)) <= 500  # json_object: any object
        assert isinstance(json.loads("".join(document_tokens(seed, None))), dict)


def test_strings_are_words_with_some_odd_unicode() -> None:
    schema = {"type": "array", "items": {"type": "string"}, "minItems": 40, "maxItems": 40}
    text = "".join(document_tokens(SEEDS[1], schema))
    assert not text.isascii() and " " in text


@given(st.text(min_size=0, max_size=200))
def test_json_tokens_join_back_in_pieces_of_one_to_four_characters(text: str) -> None:
    pieces = json_tokens(text)
    assert "".join(pieces) == text
    assert all(1 <= len(piece) <= 4 for piece in pieces)


def test_json_tokens_keep_words_and_structure_apart() -> None:
    assert json_tokens('{"city":"Oslo"}') == ('{"', "city", '":"', "Oslo", '"}')
    assert json_tokens(" description") == (" des", "crip", "tion")


def test_a_schema_note_is_read_and_left_out_of_the_seed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    note = SCHEMA_NOTE + json.dumps(schema)
    text, fmt = split_note(f"Be brief.\n\n{note}\n")
    assert text == "Be brief." and fmt is not None and fmt.schema == schema
    plain = conversation_of(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go"}]
    )
    noted = conversation_of(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": note},
            {"role": "user", "content": "Go"},
        ]
    )
    assert noted.seed() == plain.seed() and noted.format_note() == fmt
    assert plain.format_note() is None


def test_a_plan_cut_and_corrupted_keeps_its_tokens_in_order() -> None:
    conversation = conversation_of([{"role": "user", "content": "Go. [fake:tools=2]"}])
    shape = Shape(
        tools=(
            ToolDef("a", json.dumps(SCHEMAS["flat"])),
            ToolDef("b", json.dumps(SCHEMAS["unions"])),
        )
    )
    whole = plan(conversation, None, None, 20, shape=shape)
    assert whole.finish == "tool_calls" and len(whole.pieces) == 20 and len(whole.calls) == 2
    cut = plan(conversation, None, 25, 20, shape=shape)
    assert cut.finish == "length" and [len(c.pieces) for c in cut.calls] == [5]
    assert not cut.calls[0].complete and cut.tokens == 25
    broken = whole.corrupted(22)
    assert broken.pieces == whole.pieces and broken.calls[0].pieces[:2] == whole.calls[0].pieces[:2]
    assert all(c.broken and not c.complete for c in broken.calls)
    for call in broken.calls:
        with pytest.raises(ValueError):
            json.loads(call.arguments)
