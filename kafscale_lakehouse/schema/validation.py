"""JSON Schema validation of record values (`schema.mode: lenient | strict`), with the `jsonschema` library.

- The validator class follows the document's `$schema` (draft 3 to 2020-12); a document without one is Draft
  2020-12; an unknown `$schema` is an invalid document rather than a guess. A document is checked against its
  metaschema and compiled once (`compile_json_schema`); the compiled schema is reused for every record.
- `format` is an annotation, never asserted, in every draft (as JSON Schema 2019-09+ specifies and `jsonschema`
  does by default). The Go processor's validator library asserts formats in draft-07 and older documents; we
  don't, because `jsonschema` silently skips the checks whose optional packages are missing (`date-time`, `uri`).
- `$ref` is resolved within the document only; remote references are never fetched (as in Go). A reference that
  cannot be resolved is a fault of the document (`InvalidSchemaDocumentError`), never of a record.
- A null value is a tombstone (KafScale has no compaction, so they stay in the log): a valid record, never judged
  by the schema (as in Go). A value that is not UTF-8 JSON (NaN/Infinity included) and a value nested too deeply
  to validate are invalid records with their reason. (Go accepts an empty value without validating it too.)
- Each invalid record gets one error, jsonschema's `best_match`: the reason, the path of the offending value
  (`$.store_id`) and the violated schema keyword as a JSON Pointer (`#/properties/store_id/type`; jsonschema
  follows `$ref` transparently, so a keyword reached through a reference shows the path it was reached by).

Performance: jsonschema is pure Python and does the per-record work here; JSON parsing (`json.loads`, C) is a
small part of it. Figures: `kafscale_lakehouse_tests/schema_registry/bench_validation.py`.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import referencing.exceptions
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError as JsonSchemaDocumentError
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from kafscale_lakehouse.schema.errors import SchemaError
from kafscale_lakehouse.schema.json_values import json_kind

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_LIMIT = 10
DEFAULT_DIALECT = Draft202012Validator
# jsonschema messages quote the offending value; a whole record in a reason would swamp the metadata.
_MAX_REASON_CHARS = 300
_SHOWN_VIOLATIONS = 3


class InvalidSchemaDocumentError(SchemaError):
    """A JSON Schema document that cannot be used: not JSON, not a schema, unknown `$schema`, unresolvable `$ref`.

    A fault of the schema (its source is named), not of any record: it fails the run instead of rejecting records."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"JSON Schema {source}: {problem}")

    def __reduce__(self) -> tuple[object, ...]:  # keep source/problem when pickled across Spark workers
        return (type(self), (self.source, self.problem))


@dataclass(frozen=True)
class InvalidRecord:
    """Why one record failed validation. `row` is its index in the validated batch.

    `instance_path` is the JSONPath of the offending value (`$` is the whole value); `schema_path` the JSON Pointer
    of the violated keyword in the schema (`#/properties/store_id/type`), None when the value is not JSON at all."""

    row: int
    record_id: str
    reason: str
    instance_path: str
    schema_path: str | None

    def describe(self) -> str:
        where = self.instance_path if self.schema_path is None else f"{self.instance_path} (schema {self.schema_path})"
        return f"record {self.record_id} at {where}: {self.reason}"

    def as_metadata(self) -> dict[str, str | None]:
        return {
            "record_id": self.record_id,
            "reason": self.reason,
            "instance_path": self.instance_path,
            "schema_path": self.schema_path,
        }


class SchemaViolationError(SchemaError):
    """Records violate the topic's JSON Schema in strict mode: the run fails before committing.

    The message names the schema, the counts and the first violations (record_id, value path, schema path, reason)."""

    def __init__(self, summary: ValidationSummary) -> None:
        self.summary = summary
        shown = "; ".join(record.describe() for record in summary.samples[:_SHOWN_VIOLATIONS])
        more = summary.invalid_count - min(len(summary.samples), _SHOWN_VIOLATIONS)
        super().__init__(
            f"{summary.invalid_count} of {summary.record_count} records violate JSON Schema {summary.schema_source}: "
            f"{shown}"
            + (f"; and {more} more" if more > 0 else "")
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.summary,))


@dataclass(frozen=True)
class ValidationSummary:
    """Counts and the first invalid records of one or more validated batches (for asset check metadata)."""

    schema_source: str
    record_count: int
    invalid_count: int
    samples: tuple[InvalidRecord, ...]

    @property
    def valid_count(self) -> int:
        return self.record_count - self.invalid_count

    def merge(self, other: ValidationSummary, sample_limit: int = DEFAULT_SAMPLE_LIMIT) -> ValidationSummary:
        """Both summaries as one (same schema source), keeping at most `sample_limit` samples in batch order."""
        return ValidationSummary(
            schema_source=self.schema_source,
            record_count=self.record_count + other.record_count,
            invalid_count=self.invalid_count + other.invalid_count,
            samples=(self.samples + other.samples)[:sample_limit],
        )

    def metadata(self) -> dict[str, Any]:
        """JSON-friendly counts and samples: `records`, `valid`, `invalid`, `schema`, `invalid_samples`."""
        return {
            "records": self.record_count,
            "valid": self.valid_count,
            "invalid": self.invalid_count,
            "schema": self.schema_source,
            "invalid_samples": [record.as_metadata() for record in self.samples],
        }

    def raise_if_invalid(self) -> None:
        """Strict mode: raise `SchemaViolationError` when any record is invalid."""
        if self.invalid_count:
            raise SchemaViolationError(self)


@dataclass(frozen=True)
class ValidationResult:
    """Per-row validity of one batch (`valid[i]` is false for row i when it is invalid) and every invalid record."""

    schema_source: str
    valid: pa.BooleanArray
    invalid_records: tuple[InvalidRecord, ...]

    @property
    def record_count(self) -> int:
        return len(self.valid)

    @property
    def invalid_count(self) -> int:
        return len(self.invalid_records)

    @property
    def valid_count(self) -> int:
        return self.record_count - self.invalid_count

    def reasons(self) -> pa.StringArray:
        """One entry per row: null for a valid record, `instance_path: reason` for an invalid one (dead-letter rows)."""
        reasons: list[str | None] = [None] * self.record_count
        for record in self.invalid_records:
            reasons[record.row] = f"{record.instance_path}: {record.reason}"
        return pa.array(reasons, type=pa.string())

    def summary(self, sample_limit: int = DEFAULT_SAMPLE_LIMIT) -> ValidationSummary:
        return ValidationSummary(
            schema_source=self.schema_source,
            record_count=self.record_count,
            invalid_count=self.invalid_count,
            samples=self.invalid_records[:sample_limit],
        )


@dataclass(frozen=True, eq=False)
class CompiledJsonSchema:
    """A checked JSON Schema document with its validator, built once by `compile_json_schema` and shared
    (validators keep no state between calls). `source` names where the document came from (the registry URL,
    or e.g. `inline`) in every error."""

    document: Mapping[str, Any] | bool
    source: str
    validator: Validator

    # jsonschema validators do not pickle; Spark workers rebuild from the document
    def __reduce__(self) -> tuple[object, ...]:
        return (compile_json_schema, (self.document, self.source))


def compile_json_schema(document: Any, source: str) -> CompiledJsonSchema:
    """Check `document` against its metaschema and build its validator; raises `InvalidSchemaDocumentError`."""
    return CompiledJsonSchema(document=document, source=source, validator=_build_validator(document, source))


def _build_validator(document: Any, source: str) -> Validator:
    if isinstance(document, bool):
        validator_class: type[Validator] = DEFAULT_DIALECT
    elif isinstance(document, Mapping):
        dialect = document.get("$schema")
        if dialect is None:
            validator_class = DEFAULT_DIALECT
        else:
            found = validator_for(document, default=None) if isinstance(dialect, str) else None
            if found is None:
                raise InvalidSchemaDocumentError(
                    source,
                    f"$schema {dialect!r} is not a JSON Schema dialect this validator knows (draft 3 to 2020-12)",
                )
            validator_class = found
    else:
        raise InvalidSchemaDocumentError(source, f"a JSON Schema is an object or a boolean, not {json_kind(document)}")
    try:
        validator_class.check_schema(document)
    except JsonSchemaDocumentError as exc:
        raise InvalidSchemaDocumentError(source, f"at {exc.json_path}: {_shorten(exc.message)}") from None
    # No format_checker: `format` is an annotation (module docstring).
    return validator_class(document)


def validate_values(
    values: pa.Array | pa.ChunkedArray,
    record_ids: pa.Array | pa.ChunkedArray | Sequence[str],
    schema: CompiledJsonSchema,
) -> ValidationResult:
    """Validate raw record values (Arrow binary or string, null for a tombstone: always valid) row by row.

    `record_ids[i]` names row i in the reasons. Raises `InvalidSchemaDocumentError` when the schema itself fails
    (an unresolvable `$ref`), `ValueError` when the two inputs differ in length."""
    _check_lengths(len(values), len(record_ids))
    return _validate(schema, [_parse_json_value(raw) for raw in values.to_pylist()], record_ids)


def validate_parsed(
    instances: Sequence[Any],
    record_ids: pa.Array | pa.ChunkedArray | Sequence[str],
    schema: CompiledJsonSchema,
) -> ValidationResult:
    """Validate values the caller has already parsed from JSON (`json.loads` output; None is JSON null, which the
    schema judges). Same result and errors as `validate_values`, without parsing twice."""
    _check_lengths(len(instances), len(record_ids))
    return _validate(schema, instances, record_ids)


def _check_lengths(value_count: int, record_id_count: int) -> None:
    if value_count != record_id_count:
        raise ValueError(
            f"{value_count} values but {record_id_count} record_ids: there must be one record_id per value"
        )


class _NotJson:
    """Stands for a record value that did not parse, in the list of parsed values."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


_TOMBSTONE = object()  # stands for a null record value in the list of parsed values: not validated, valid


def _validate(
    schema: CompiledJsonSchema,
    instances: Sequence[Any],
    record_ids: pa.Array | pa.ChunkedArray | Sequence[str],
) -> ValidationResult:
    validator = schema.validator
    valid = [True] * len(instances)
    invalid_records = []
    for row, instance in enumerate(instances):
        failure: tuple[str, str, str | None]  # reason, instance path, schema path
        if instance is _TOMBSTONE:
            continue
        if isinstance(instance, _NotJson):
            failure = (instance.reason, "$", None)
        else:
            try:
                errors = validator.iter_errors(instance)
                first = next(errors, None)
                if first is None:
                    continue
                # best_match weighs all errors, so the rest are only collected for invalid records.
                error: ValidationError = best_match(itertools.chain([first], errors))
            except referencing.exceptions.Unresolvable as exc:
                raise InvalidSchemaDocumentError(
                    schema.source, f"$ref {exc.ref!r} cannot be resolved (only references within the document are)"
                ) from None
            except RecursionError:
                failure = ("value is nested too deeply to validate", "$", None)
            else:
                failure = (_shorten(error.message), error.json_path, _json_pointer(error.schema_path))
        valid[row] = False
        reason, instance_path, schema_path = failure
        invalid_records.append(
            InvalidRecord(
                row=row,
                record_id=_record_id(record_ids, row),
                reason=reason,
                instance_path=instance_path,
                schema_path=schema_path,
            )
        )
    if invalid_records:
        log.debug("%d of %d records violate JSON Schema %s", len(invalid_records), len(instances), schema.source)
    return ValidationResult(
        schema_source=schema.source, valid=pa.array(valid, type=pa.bool_()), invalid_records=tuple(invalid_records)
    )


def _record_id(record_ids: pa.Array | pa.ChunkedArray | Sequence[str], row: int) -> str:
    record_id = record_ids[row]
    return record_id.as_py() if isinstance(record_id, pa.Scalar) else record_id


def _parse_json_value(raw: bytes | str | None) -> Any:
    """The JSON value of a record value, `_TOMBSTONE` for a null value, or `_NotJson` saying why it is none."""
    if raw is None:
        return _TOMBSTONE
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _NotJson(f"value is not valid UTF-8 (byte {exc.start})")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except ValueError as exc:  # JSONDecodeError, and NaN/Infinity
        return _NotJson(f"value is not valid JSON: {exc}")
    except RecursionError:
        return _NotJson("value is not valid JSON: nested too deeply")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _json_pointer(path: Iterable[str | int]) -> str:
    return "#" + "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _shorten(text: str) -> str:
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."
