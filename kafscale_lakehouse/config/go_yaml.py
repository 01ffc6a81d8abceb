"""The config file read as KafScale's Go processor reads it: YAML through yaml.v3 into typed Go fields.

Invariants (see the package docstring for what they mean for a config):
- booleans are YAML 1.2's `true`/`false` only, so `off`/`yes` stay strings, except in a key Go types as a boolean,
  which also takes the YAML 1.1 words yaml.v3 accepts there (`YAML11_TRUE`, `YAML11_FALSE`, quoted or not);
- a plain number, boolean or date keeps the text it was written with (`YamlScalar`): a key Go types as a string
  takes that text (`topic: 0x10` is "0x10"), any other key the value; an integral float (`30.0`) fills an integer
  key, a fractional one does not;
- an unset Go field is its zero value: a null, an empty string (unless the section says `""` is a value) and, for the
  keys a section names, a `0` mean "use the default";
- duplicate keys are an error, not "the last one wins".
Every config section derives from `ConfigModel`, which applies these rules to its own keys before pydantic validates
them strictly (unknown keys forbidden). `ParsedAs` lets a key be written as a config section and held as a lower
layer's type.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, is_dataclass
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, SecretStr, model_validator
from pydantic_core import core_schema

# What yaml.v3 accepts for a Go `bool` field besides true/false (decode.go: "compatibility with the 1.1 spec").
YAML11_TRUE = frozenset({"y", "Y", "yes", "Yes", "YES", "on", "On", "ON"})
YAML11_FALSE = frozenset({"n", "N", "no", "No", "NO", "off", "Off", "OFF"})


class YamlScalar:
    """A plain (unquoted) YAML number or boolean from the config file: its value and its text as written, so that a
    key Go types as a string gets the text (`topic: 0x10` is "0x10", not "16") and any other key the value."""

    __slots__ = ("text", "value")

    def __init__(self, value: Any, text: str) -> None:
        self.value = value
        self.text = text

    def __repr__(self) -> str:
        return repr(self.value)


def plain(value: Any) -> Any:
    """`value` with every `YamlScalar` replaced by its value (where no field type says otherwise)."""
    if isinstance(value, YamlScalar):
        return value.value
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


@dataclass(frozen=True)
class ParsedAs:
    """Field metadata, `Annotated[Column, ParsedAs(ColumnEntry)]`: the key is written as the config section `entry`
    (its keys, Go decoding and error messages are that section's) and held as what the validated section's
    `parsed()` returns, a lower layer's frozen dataclass (the annotated type), which is also what the key dumps as
    (a mapping of its fields). A value that already is of that type is taken as it is."""

    entry: type[ConfigModel]

    def __get_pydantic_core_schema__(self, source_type: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def parse(value: Any, validate_entry: core_schema.ValidatorFunctionWrapHandler) -> Any:
            if isinstance(value, source_type):
                return value
            return validate_entry(value).parsed()

        return core_schema.no_info_wrap_validator_function(
            parse, handler.generate_schema(self.entry),
            serialization=core_schema.plain_serializer_function_ser_schema(_as_dict),
        )


def _as_dict(value: Any) -> Any:
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


def annotation_types(annotation: Any) -> tuple[Any, ...]:
    """The alternatives of a field type as written in YAML: `str | None` -> (str, NoneType); `Annotated[X, ...]` ->
    X's; `Annotated[X, ParsedAs(entry)]` -> (entry,)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        parsed_as = [meta for meta in annotation.__metadata__ if isinstance(meta, ParsedAs)]
        if parsed_as:
            return (parsed_as[0].entry,)
        return annotation_types(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return tuple(t for argument in get_args(annotation) for t in annotation_types(argument))
    return (annotation,)


def _takes_text(types: tuple[Any, ...]) -> bool:
    return any(t is str or t is SecretStr or (get_origin(t) is Literal and all(isinstance(a, str) for a in get_args(t)))
               for t in types)


def as_go_decodes(value: Any, annotation: Any) -> Any:
    """`value` as yaml.v3 would decode it into a Go field of this key's type (see the module docstring)."""
    types = annotation_types(annotation)
    if isinstance(value, YamlScalar):
        if _takes_text(types):
            return value.text
        value = value.value
    if isinstance(value, str) and bool in types and not _takes_text(types):
        if value in YAML11_TRUE:
            return True
        if value in YAML11_FALSE:
            return False
    if isinstance(value, float) and int in types and float not in types and value.is_integer():
        return int(value)
    for t in types:
        if isinstance(value, dict) and isinstance(t, type) and issubclass(t, BaseModel):
            return value  # the nested model's own validator decodes its keys
        if isinstance(value, list) and get_origin(t) is list:
            [item_type] = get_args(t) or (Any,)
            return [as_go_decodes(item, item_type) for item in value]
    return plain(value)


class ConfigModel(BaseModel):
    """A config section: strict (unknown keys and wrong types are errors), its keys decoded as Go decodes them."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Keys for which the Go processor's zero value `0` means "use the default".
    _ZERO_MEANS_DEFAULT: ClassVar[frozenset[str]] = frozenset()
    # Keys where an empty string is a real value rather than "not set".
    _EMPTY_IS_A_VALUE: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _unset_go_zero_values(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return plain(data)
        fields = {info.alias or name: info for name, info in cls.model_fields.items()}
        kept = {}
        for key, value in data.items():
            info = fields.get(key)
            value = as_go_decodes(value, info.annotation) if info is not None else plain(value)
            if info is not None and not info.is_required():
                if value is None or (value == "" and key not in cls._EMPTY_IS_A_VALUE):
                    continue
                if type(value) is int and value == 0 and key in cls._ZERO_MEANS_DEFAULT:
                    continue
            kept[key] = value
        return kept


# libyaml's parser where PyYAML was built with it: the pure-Python one took ~1 s of every code-location load and run
# launch for a config of 200 mappings. Tags, constructors and resolvers below are the Python ones either way.
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigYamlLoader(_SAFE_LOADER):
    """SafeLoader with YAML 1.2 booleans (only true/false, so `off`/`yes` stay strings) that rejects duplicate keys and
    keeps the text of plain numbers, booleans and dates (`YamlScalar`) for the keys Go reads as strings."""

    def construct_mapping(self, node, deep=False) -> dict[Any, Any]:  # noqa: ANN001 - PyYAML signature
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = plain(self.construct_object(key_node, deep=deep))
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return {plain(key): value for key, value in super().construct_mapping(node, deep=deep).items()}


def _construct_go_scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode, construct) -> YamlScalar:  # noqa: ANN001
    return YamlScalar(construct(loader, node), node.value)


for _tag, _construct in (
    ("int", yaml.SafeLoader.construct_yaml_int),
    ("float", yaml.SafeLoader.construct_yaml_float),
    ("bool", yaml.SafeLoader.construct_yaml_bool),
    ("timestamp", yaml.SafeLoader.construct_yaml_timestamp),
):
    ConfigYamlLoader.add_constructor(
        f"tag:yaml.org,2002:{_tag}",
        lambda loader, node, construct=_construct: _construct_go_scalar(loader, node, construct),
    )

ConfigYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return problem
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
