"""Config errors: `ConfigError` and the translation of pydantic's validation errors into messages naming the key.

Every problem is one line `key.path: what is wrong` (`mappings[0].schema.columns[1].type: 'decimal' is not one of
...`), all problems of a file are reported at once, an unknown key suggests the closest known one, and the value of
a secret key is never shown.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from kafscale_lakehouse.config.go_yaml import annotation_types


class ConfigError(ValueError):
    """The config file cannot be used; `problems` holds one `key.path: what is wrong` line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(f"{source}: {problem}" for problem in self.problems))


SECRET_KEYS = frozenset({"password", "token", "secret_access_key", "credential"})
_TYPE_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "bool_type": "true or false",
    "float_type": "a number",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "path_type": "a path",
}


def format_path(loc: tuple[str | int, ...]) -> str:
    """`mappings[0].schema.columns` for `("mappings", 0, "schema", "columns")`."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def json_kind(value: Any) -> str:
    """What a YAML value is, in the words of the messages: `null`, `a boolean`, `a number`, `a list`, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def describe_validation_error(error: Mapping[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error of validating the model `root` as a `key.path: what is wrong` line."""
    loc = tuple(part for part in error["loc"] if part != "[key]")
    path = format_path(loc)
    kind = error["type"]
    value = error.get("input")
    secret = bool(loc) and loc[-1] in SECRET_KEYS
    shown = "(hidden)" if secret else repr(value)
    if kind == "missing":
        return f"{path}: is required"
    if kind == "extra_forbidden":
        return f"{path}: unknown key{_suggestion(root, loc)}"
    if kind == "literal_error":
        allowed = ", ".join(re.findall(r"'([^']*)'", error["ctx"]["expected"]))
        return f"{path}: {shown} is not one of {allowed}"
    if kind == "greater_than":
        return f"{path}: must be greater than {error['ctx']['gt']}, got {shown}"
    if kind == "greater_than_equal":
        return f"{path}: must be at least {error['ctx']['ge']}, got {shown}"
    if kind in _TYPE_NAMES:
        return f"{path}: expected {_TYPE_NAMES[kind]}, got {json_kind(value)}" + (
            "" if secret or isinstance(value, (dict, list)) else f" {shown}"
        )
    return f"{path}: {error['msg']} (got {shown})"


def _suggestion(root: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    allowed = _allowed_keys(root, loc[:-1])
    if not allowed or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (expected one of {', '.join(sorted(allowed))})"


def _allowed_keys(root: type[BaseModel], parent: tuple[str | int, ...]) -> list[str]:
    """The YAML keys of the model at `parent`, found by walking the model classes along the error location."""
    model = root
    for part in parent:
        if isinstance(part, int):
            continue
        field = next((info for name, info in model.model_fields.items() if (info.alias or name) == part), None)
        if field is None:
            return []
        nested = _model_class_in(field.annotation)
        if nested is None:
            return []
        model = nested
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_class_in(annotation: Any) -> type[BaseModel] | None:
    for written_as in annotation_types(annotation):
        if isinstance(written_as, type) and issubclass(written_as, BaseModel):
            return written_as
        for argument in getattr(written_as, "__args__", ()):
            found = _model_class_in(argument)
            if found is not None:
                return found
    return None
