"""A JSON Schema of the pizza orders of `kafscale_lakehouse.apps.workload`, as a registry would serve it."""

from __future__ import annotations

from typing import Any

PIZZA_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "completed pizza order",
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "format": "uuid"},
        "store_id": {"type": "integer", "minimum": 1, "maximum": 100},
        "sauce": {"enum": ["regular", "light", "extra", "none", "bbq", "alfredo"]},
        "cheese": {"type": "string"},
        "meats": {"type": "string"},
        "veggies": {"type": "string"},
        # The workload writes `YYYY-MM-DD HH:MM:SS`, which is not RFC 3339 `date-time`: a pattern says what it is.
        "date_ordered": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}$"},
        "toppings": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["order_id", "store_id", "sauce", "date_ordered"],
    "additionalProperties": False,
}
