"""Realistic JSON schemas, each with a prompt, for the structured-output tests (and benchmarks).

Every answer generated under one of these must validate against it with ``jsonschema``.
"""

from __future__ import annotations

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 60},
        "city": {"type": "string", "maxLength": 40},
        "postcode": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["street", "city", "postcode"],
    "additionalProperties": False,
}

CORPUS: dict[str, tuple[dict, str]] = {
    "extraction": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 40},
                "age": {"type": "integer"},
                "email": {"type": "string", "format": "email", "maxLength": 40},
            },
            "required": ["name", "age", "email"],
            "additionalProperties": False,
        },
        "Extract the person: Marie Curie, 34 years old, marie@example.org.",
    ),
    "classification": (
        {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["sentiment", "confidence"],
            "additionalProperties": False,
        },
        "Classify the sentiment of: 'I love this phone, the battery lasts forever.'",
    ),
    "invoice": (
        {
            "type": "object",
            "properties": {
                "invoice_number": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
                "date": {"type": "string", "format": "date"},
                "currency": {"const": "EUR"},
                "lines": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "description": {"type": "string", "maxLength": 30},
                            "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                            "unit_price": {"type": "number", "exclusiveMinimum": 0},
                        },
                        "required": ["description", "quantity", "unit_price"],
                        "additionalProperties": False,
                    },
                },
                "total": {"type": "number"},
            },
            "required": ["invoice_number", "date", "currency", "lines", "total"],
            "additionalProperties": False,
        },
        "Write invoice INV-0042 of 2026-03-01: 2 keyboards at 49.90 EUR, 1 mouse at 19.00 EUR.",
    ),
    "nested_arrays": (
        {
            "type": "object",
            "properties": {
                "matrix": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 2,
                    "items": {"type": "array", "minItems": 2, "maxItems": 3, "items": {"type": "integer"}},
                },
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
                "point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                          "items": False},
            },
            "required": ["matrix", "tags", "point"],
            "additionalProperties": False,
        },  # fmt: skip
        "Give a 2x2 matrix of small integers, up to four tags about math, and a 2D point.",
    ),
    "any_of_shapes": (
        {
            "type": "object",
            "properties": {
                "shape": {
                    "anyOf": [
                        {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number"}},
                         "required": ["kind", "radius"], "additionalProperties": False},
                        {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "number"},
                                                          "h": {"type": "number"}},
                         "required": ["kind", "w", "h"], "additionalProperties": False},
                    ]
                }
            },
            "required": ["shape"],
            "additionalProperties": False,
        },  # fmt: skip
        "Describe a circle of radius 2 as JSON.",
    ),
    "ref_addresses": (
        {
            "$defs": {"address": ADDRESS},
            "type": "object",
            "properties": {"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}},
            "required": ["home", "work"],
            "additionalProperties": False,
        },
        "Marie lives at 1 Rue Cuvier, Paris 75005 and works at 12 Rue Lhomond, Paris 75005.",
    ),
    "recursive_tree": (
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 20},
                        "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["name", "children"],
                    "additionalProperties": False,
                }
            },
            "$ref": "#/$defs/node",
        },
        "Give a small family tree: Ann has two children, Bob and Cid; they have none.",
    ),
    "dates_by_pattern": (
        {
            "type": "object",
            "properties": {
                "start": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"},
                "end": {"type": "string", "format": "date-time"},
                "id": {"type": "string", "format": "uuid"},
                "at": {"type": "string", "format": "time"},
            },
            "required": ["start", "end", "id", "at"],
            "additionalProperties": False,
        },
        "A meeting starts on 2026-05-04 and ends 2026-05-04T17:00:00Z, at 09:30:00Z. Give it an id.",
    ),
    "integer_ranges": (
        {
            "type": "object",
            "properties": {
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                "month": {"type": "integer", "minimum": 1, "maximum": 12},
                "score": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5},
                "ratio": {"type": "number", "minimum": -1.5, "maximum": 1.5},
            },
            "required": ["year", "month", "score", "ratio"],
            "additionalProperties": False,
        },
        "The film came out in March 1997; rate it from -4 to 4 and give a ratio.",
    ),
    "nullable": (
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "subtitle": {"type": ["string", "null"], "maxLength": 40},
                "pages": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
                "isbn": {"type": ["string", "null"], "pattern": "^[0-9]{13}$"},
            },
            "required": ["title", "subtitle", "pages", "isbn"],
            "additionalProperties": False,
        },
        "The book 'Dune' has no subtitle; its page count is unknown.",
    ),
}
