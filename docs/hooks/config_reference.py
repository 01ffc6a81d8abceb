"""The configuration reference, generated from the config models at every docs build, so it cannot drift.

`mkdocs build` runs this hook (mkdocs.yml `hooks:`): the marker `<!-- configuration-reference -->` in
docs/configuration.md becomes one table per config section, one row per key, straight from
`kafscale_lakehouse.config.models`: the key as written in YAML (aliases such as `schema`), its type and default as
pydantic validates them, and its description from the comments and docstrings of models.py (the comment on the
field's lines and the comment lines right above it). What the Go processor does with a key comes from `GO_KEYS`
below; a path there that the models do not have fails the build.

`config_keys()` is also what kafscale_lakehouse_tests/test_docs_references.py checks YAML snippets against.
"""

from __future__ import annotations

import ast
import inspect
import io
import logging
import re
import tokenize
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

from kafscale_lakehouse.config import models
from kafscale_lakehouse.config.go_yaml import ParsedAs

log = logging.getLogger("mkdocs.hooks.config_reference")

MARKER = "<!-- configuration-reference -->"
ROOT = models.LakehouseConfig

# Keys of KafScale's Go `iceberg-processor` (its internal/config/config.go, and `mappings[].lfs` of KafScale main)
# and what it does with each. Every other key is an extension of ours, which the Go processor's yaml.v3 decoding
# ignores (it drops unknown keys).
GO_KEYS: dict[str, str] = {
    **dict.fromkeys((
        "s3", "iceberg", "iceberg.catalog", "offsets", "discovery", "etcd", "schema", "schema.registry", "processor",
        "mappings", "mappings[].schema", "mappings[].schema.columns", "mappings[].lfs"), "the same section"),
    "s3.bucket": "required; the bucket of the segments, and of LFS blobs",
    "s3.namespace": "the namespace directory under the bucket",
    "s3.endpoint": "S3 endpoint of the segment reads",
    "s3.region": "S3 region",
    "s3.path_style": "path-style addressing",
    "iceberg.catalog.type": "required; `rest` only",
    "iceberg.catalog.uri": "required; the REST catalog URI",
    "iceberg.catalog.token": "bearer token of the REST catalog",
    "iceberg.catalog.username": "REST catalog user",
    "iceberg.catalog.password": "REST catalog password",
    "iceberg.warehouse": "the catalog's warehouse",
    "offsets.backend": "default `etcd`",
    "offsets.lease_ttl_seconds": "default 30 (0 means 30); the TTL of the partition leases",
    "offsets.key_prefix": "default `processors`; prefix of the offsets, watermarks and leases keys",
    "discovery.mode": "default `auto`: the broker's metadata snapshot in etcd, else S3 listing",
    "etcd.endpoints": "required with `offsets.backend: etcd`",
    "etcd.username": "etcd user",
    "etcd.password": "etcd password",
    "schema.mode": "default `off`; `lenient` / `strict` need `schema.registry.base_url`",
    "schema.registry.base_url": "where the JSON Schema of a topic is fetched (`<base_url>/<topic>.json`)",
    "schema.registry.timeout_seconds": "registry request timeout (0 means the default)",
    "schema.registry.cache_seconds": "how long a fetched schema is cached (0 means the default)",
    "processor.poll_interval_seconds": "default 5 (0 means 5); the polling loop's interval",
    "mappings[].topic": "required",
    "mappings[].table": "required; `namespace.table`",
    "mappings[].mode": "`append` only (anything else is an error)",
    "mappings[].create_table_if_missing": "creates the table on first write",
    "mappings[].schema.source": "resolved as here: `mapping` with columns, else `registry`, else `none`",
    "mappings[].schema.columns": "required for `source: mapping`",
    "mappings[].schema.columns[].name": "required; the top-level JSON key of the value",
    "mappings[].schema.columns[].type": "required; one of the nine types, case-insensitive",
    "mappings[].schema.columns[].required": "a record lacking the column is invalid",
    "mappings[].schema.allow_type_widening": "lets the table's column types widen",
    "mappings[].lfs.mode": "KafScale main: `off`, `resolve`, `reference`, `skip`, `hybrid`",
    "mappings[].lfs.max_inline_size": "KafScale main: > 0 for hybrid; in resolve mode a larger blob is an error",
    "mappings[].lfs.store_metadata": "KafScale main: adds the `lfs_*` columns",
    "mappings[].lfs.validate_checksum": "KafScale main: default true",
    "mappings[].lfs.resolve_concurrency": "KafScale main: 0 means 4, negative is an error",
}


@dataclass(frozen=True)
class Key:
    """One config key: its dotted path (`mappings[].lfs.mode`), the model that declares it and its field name."""

    path: str
    model: type[BaseModel]
    field: str
    section: type[BaseModel] | None  # the nested section the key holds, if any
    is_list: bool = False  # a list of sections: its keys are `<path>[].<key>`

    @property
    def section_path(self) -> str:
        return self.path + ("[]" if self.is_list else "")


def _yaml_name(model: type[BaseModel], field: str) -> str:
    info = model.model_fields[field]
    return info.alias or field


def _section_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The config section an annotation holds (a model, a list of one, or a `ParsedAs` entry) and whether a list."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extras = get_args(annotation)
        for extra in extras:
            if isinstance(extra, ParsedAs):
                return extra.entry, False
        return _section_of(base)
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            if arg is not type(None):
                section, is_list = _section_of(arg)
                if section is not None:
                    return section, is_list
        return None, False
    if origin is list:
        section, _ = _section_of(get_args(annotation)[0])
        return section, section is not None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def config_keys(model: type[BaseModel] = ROOT, prefix: str = "") -> Iterator[Key]:
    """Every key of the config, depth first in declaration order."""
    for field, info in model.model_fields.items():
        path = prefix + _yaml_name(model, field)
        section, is_list = _section_of(info.annotation)
        key = Key(path, model, field, section, is_list)
        yield key
        if section is not None:
            yield from config_keys(section, key.section_path + ".")


def key_paths() -> set[str]:
    """The dotted paths of every key (`mappings[].lfs.mode`)."""
    return {key.path for key in config_keys()}


# ---- descriptions from models.py's comments and docstrings ----

def _comments_by_line(source: str) -> dict[int, str]:
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    return comments


def _field_comments() -> dict[tuple[str, str], str]:
    """(class name, field name) -> the field's comment in models.py: the comment lines right above it, then the
    comment on its own lines."""
    source = inspect.getsource(models)
    lines = source.splitlines()
    comments = _comments_by_line(source)
    found = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above = []
            line = item.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            trailing = [comments[n] for n in range(item.lineno, (item.end_lineno or item.lineno) + 1) if n in comments]
            text = " ".join(part for part in [*above, *trailing] if part and not part.startswith("noqa"))
            found[(node.name, item.target.id)] = text
    return found


def _field_comment(comments: dict[tuple[str, str], str], model: type[BaseModel], field: str) -> str:
    for klass in model.__mro__:
        if (klass.__name__, field) in comments:
            return comments[(klass.__name__, field)]
    return ""


def _docstring(model: type[BaseModel]) -> str:
    doc = model.__doc__ or ""
    if model.__module__ != models.__name__ or doc.startswith(("Usage docs", "!!! abstract")):
        return ""  # pydantic's own BaseModel docstring
    return " ".join(inspect.cleandoc(doc).split())


# ---- types and defaults ----

_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _constraints(metadata: list[Any]) -> str:
    parts = []
    for item in metadata:
        for name, symbol in _BOUNDS.items():
            value = getattr(item, name, None)
            if value is not None and type(item).__name__.lower() == name:
                parts.append(f"{symbol} {value}")
    return ", ".join(parts)


def type_text(annotation: Any, metadata: list[Any] | None = None) -> str:
    """A reader's name of a field type: `integer > 0`, `one of: a, b`, `list of string`, `secret string`."""
    bound = _constraints(metadata or [])
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extras = get_args(annotation)
        for extra in extras:
            if isinstance(extra, ParsedAs):
                return "section"
        nested = [item for extra in extras for item in getattr(extra, "metadata", [])]
        return type_text(base, [*(metadata or []), *extras, *nested])
    if origin is Literal:
        return "one of: " + ", ".join(f"`{value}`" for value in get_args(annotation))
    if origin in (Union, types.UnionType):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        text = " or ".join(type_text(arg, metadata) for arg in inner)
        return f"{text}, or null" if len(inner) < len(get_args(annotation)) else text
    if origin is list:
        section, _ = _section_of(annotation)
        return "list of sections" if section is not None else f"list of {type_text(get_args(annotation)[0])}"
    if origin is dict:
        return "map of string to string"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    names = {bool: "boolean", int: "integer", str: "string", Path: "path", SecretStr: "secret string",
             float: "number"}
    name = names.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return f"{name} {bound}" if bound else name


def _size_hint(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f" ({value // size} {unit})"
    return ""


def default_text(model: type[BaseModel], field: str) -> str:
    info = model.model_fields[field]
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(its keys' defaults)"
        return f"`{value!r}`" if value else "empty"
    value = info.default
    if value is PydanticUndefined or value is None:
        return "null"
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int):
        hint = _size_hint(value) if field.endswith("bytes") else ""
        return f"`{value}`{hint}"
    return f"`{value}`"


# ---- the page ----

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _anchor(path: str) -> str:
    return "config-" + (re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "root")


def reference_markdown() -> str:
    unknown = sorted(set(GO_KEYS) - key_paths())
    if unknown:
        raise ValueError(f"GO_KEYS names keys the config models do not have: {', '.join(unknown)}")
    comments = _field_comments()
    sections: dict[str, list[Key]] = {}
    section_models: dict[str, type[BaseModel]] = {"": ROOT}
    for key in config_keys():
        parent = key.path.rsplit(".", 1)[0] if "." in key.path else ""
        sections.setdefault(parent, []).append(key)
        if key.section is not None:
            section_models[key.section_path] = key.section
    out = []
    undocumented: list[str] = []
    for parent, keys in sections.items():
        model = section_models[parent]
        title = f"`{parent}`" if parent else "Top level"
        out.append(f'### {title} {{#{_anchor(parent)}}}\n')
        doc = _docstring(model)
        if doc:
            out.append(doc + "\n")
        zero = sorted(getattr(model, "_ZERO_MEANS_DEFAULT", ()))
        if zero:
            out.append("A `0` in " + ", ".join(f"`{name}`" for name in zero) + " means the default, as in Go.\n")
        out.append("| key | type | default | description | Go processor |")
        out.append("|---|---|---|---|---|")
        for key in keys:
            info = key.model.model_fields[key.field]
            name = key.path.rsplit(".", 1)[-1]
            typ = type_text(info.annotation, list(info.metadata))
            if key.section is not None:
                typ = f"[{typ}](#{_anchor(key.section_path)})"
            description = _field_comment(comments, key.model, key.field)
            description = re.sub(r"^[Ee]xtension\b[:;,]?\s*", "", description)
            if not description:
                undocumented.append(key.path)
            go = GO_KEYS.get(key.path, "extension: not read (Go ignores unknown keys)")
            out.append(f"| `{name}` | {_cell(typ)} | {_cell(default_text(key.model, key.field))} "
                       f"| {_cell(description)} | {_cell(go)} |")
        out.append("")
    if undocumented:
        raise ValueError("config keys without a comment in kafscale_lakehouse/config/models.py (the reference's "
                         f"description): {', '.join(undocumented)}")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:  # mkdocs hook
    if MARKER not in markdown:
        return markdown
    log.info("configuration reference generated from %s", models.__name__)
    return markdown.replace(MARKER, reference_markdown())
