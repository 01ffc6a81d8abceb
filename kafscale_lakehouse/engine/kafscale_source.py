"""The `kafscale` PySpark data source: exact Kafka offset ranges of one topic, read straight from KafScale segments.

    register_kafscale_source(spark)
    df = spark.read.format("kafscale").options(**read_options.to_options()).load()
    # or: df = read_kafscale(spark, read_options)

Options (case-insensitive, like every Spark source option; an unknown option is an error):
- `store`: `s3` (default) or `local`. For `s3`: `bucket` (required), `endpoint`, `region`, `pathStyle`
  (`true`/`false`), and `s3.accessKeyId` + `s3.secretAccessKey` (+ `s3.sessionToken`); without keys the executors
  use the AWS credential chain. These names match Spark's default `spark.redaction.regex`, so plans and the UI
  never show them. For `local`: `localRoot`. Both: `namespace` (default `default`, may be empty).
- `topic`.
- `startingOffsets` (inclusive) and `endingOffsets` (exclusive, required), JSON as in Spark's Kafka source:
  `{"<topic>": {"0": 100, "1": 250}}`. Starting `-2` = earliest; ending `-1` = the end of the latest completed
  segment. The partitions read are those of `endingOffsets`; one missing from `startingOffsets` starts at earliest.
- `columns`: JSON list of mapped columns `[{"name": ..., "type": ..., "required": ...}]` (config `schema.columns`).
- `maxBytesPerPartition`: segment bytes per input partition (default 128 MiB).
- `onSegmentError`: `fail` (default) or `mark` (below).
- `lfs`: JSON of `lfs_resolution.LfsReadSettings` (the mapping's `lfs` block and where failures go): envelope
  records are resolved, referenced or skipped on the executors (engine/lfs_resolution.py); with `store_metadata` the
  `lfs_*` columns (`schema.columns.LFS_METADATA_COLUMNS`) must end `columns` and are filled by that stage. A record
  that fails there stops its partition like a failing segment (an error marker whose `error_type` is
  `LfsResolutionError` and whose `key` is the blob), or with `on_error` dead_letter is an invalid record.
- `jsonSchema` (+ `jsonSchemaSource`, where it came from, for messages): a JSON Schema document every record value is
  validated against on the executors (`schema.mode` lenient/strict). The driver fetches it from the registry, so an
  unreachable registry fails the run before any task starts and executors never call it.

Schema: the base columns (`BASE_SCHEMA`), then the mapped columns in option order (types from the schema layer,
all nullable: a required column is null in an invalid record), then `_kafscale_invalid_reason` (string, nullable),
then, only with `jsonSchema`, `_kafscale_invalid_schema_path` (string, nullable).

Invalid records (a required mapped column missing or not coercible, or a value that is no JSON object while a column
is required, or with `jsonSchema` a value that violates it) are kept: `_kafscale_invalid_reason` says why
(`<column>: <reason>`; the reason alone when the whole value is at fault; `<value path>: <reason>` for a schema
violation, which wins over a coercion failure of the same record) and is null for valid records.
`_kafscale_invalid_schema_path` is the JSON Pointer of the violated schema keyword (`#/properties/store_id/type`),
null unless the record violates the schema. The writer splits on them (table vs dead letters) and drops them.

Planning (driver, `plan_read`): per Kafka partition, one listing of the partition's keys finds the segment holding
the start offset, then `SegmentStore.list_segments` reads footers from that segment on only (up to the end offset),
so segments below the range cost nothing but their share of the key listing. A gap inside the range, or between
the start offset and the first segment, fails (`OffsetGapError`); an end beyond the last completed segment fails
(`OffsetRangeError`). An input partition (`SegmentRunPartition`) is a run of consecutive segments of one Kafka
partition, up to `maxBytesPerPartition` of `.kfs` bytes (a larger segment is a run of its own), and carries its own
offset sub-range.

Reading (executors, `read_input_partition`): each segment is fetched once and decoded with CRC checks, limited to
the range. A segment in which the start offset falls mid-way is range-read: its `.index` (one GET), then one ranged
GET from the index entry at or before the start offset to the end of the object, decoded with `decode_batches`.
Arrow batches of at most `MAX_ROWS_PER_BATCH` rows are yielded in the schema above.

Segment errors: with `onSegmentError=fail` the `SegmentFormatError` / `StorageError` is raised (its message names
the object and byte offset) and the Spark job fails. With `mark`, the input partition stops at the failing
segment and yields one final error-marker row after the rows of the segments before it: `offset` =
`ERROR_MARKER_OFFSET` (-1, never a real offset), `topic` and `partition` set, `record_id` = the failing `.kfs` key,
`timestamp_ms` = 0, `value` = UTF-8 JSON `{"key", "position", "error_type", "message", "base_offset",
"next_offset"}` (`key`: the object at fault, `.kfs` or `.index`; `position`: byte offset or null for a storage
error; `next_offset`: the first offset of the partition not delivered), every other column null.
`is_error_marker(batch)` finds marker rows and `error_markers(batch)` parses them. Other input partitions of the same
Kafka partition (later segments) still run and yield rows at or beyond the marker's `next_offset`: the writer must
not commit those (each Spark task's rows come from one `SegmentRunPartition`, so its data files can be discarded).
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict, DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from kafscale_lakehouse.config import ColumnConfig
from kafscale_lakehouse.format import (
    BASE_SCHEMA,
    FOOTER_SIZE,
    HEADER_SIZE,
    BadIndexError,
    SegmentFormatError,
    SegmentMismatchError,
    decode_batches,
    decode_segment,
    entry_for_offset,
    parse_footer,
    parse_index,
)
from kafscale_lakehouse.format.segment_index import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE
from kafscale_lakehouse.engine.lfs_resolution import (
    LFS_ERROR_TYPE,
    LfsFailure,
    LfsReadSettings,
    LfsResolver,
    LfsStats,
)
from kafscale_lakehouse.schema import JsonColumnCoercer, SchemaMappingError, record_arrow_schema
from kafscale_lakehouse.schema.columns import LFS_METADATA_COLUMNS
from kafscale_lakehouse.schema.validation import (
    CompiledJsonSchema,
    InvalidSchemaDocumentError,
    ValidationResult,
    compile_json_schema,
    validate_values,
)
from kafscale_lakehouse.storage import (
    DEFAULT_NAMESPACE,
    Gap,
    IncompleteSegment,
    LocalSegmentStore,
    ObjectKind,
    S3SegmentStore,
    SegmentRef,
    SegmentStore,
    StorageError,
    find_gaps,
    parse_segment_key,
    partition_prefix,
    segment_key,
)

log = logging.getLogger(__name__)

KAFSCALE_FORMAT = "kafscale"
EARLIEST = -2
LATEST = -1
ERROR_MARKER_OFFSET = -1
INVALID_REASON_COLUMN = "_kafscale_invalid_reason"
INVALID_SCHEMA_PATH_COLUMN = "_kafscale_invalid_schema_path"
# Columns that describe a record rather than belong to it: never written to the table.
SOURCE_STATUS_COLUMNS = (INVALID_REASON_COLUMN, INVALID_SCHEMA_PATH_COLUMN)
DEFAULT_MAX_BYTES_PER_PARTITION = 128 * 1024 * 1024
MAX_ROWS_PER_BATCH = 65_536

# Canonical option names; Spark hands them to the source lower-cased.
_STORE_OPTIONS = ("store", "namespace", "bucket", "endpoint", "region", "pathStyle", "localRoot",
                  "s3.accessKeyId", "s3.secretAccessKey", "s3.sessionToken")
_S3_ONLY_OPTIONS = ("bucket", "endpoint", "region", "pathStyle", "s3.accessKeyId", "s3.secretAccessKey",
                    "s3.sessionToken")
_READ_OPTIONS = ("topic", "startingOffsets", "endingOffsets", "columns", "maxBytesPerPartition", "onSegmentError",
                 "jsonSchema", "jsonSchemaSource", "lfs")
_OPTION_NAMES = {name.lower(): name for name in (*_STORE_OPTIONS, *_READ_OPTIONS)}
# Registering again works but makes Spark warn about replacing the source, so once per session.
_sessions_with_source: weakref.WeakSet[SparkSession] = weakref.WeakSet()


class KafscaleSourceError(Exception):
    """The kafscale source cannot read what it was asked for; the message names the option, topic or partition."""


class KafscaleOptionError(KafscaleSourceError, ValueError):
    """A source option is missing, unknown or invalid; the message names the option."""


class OffsetRangeError(KafscaleSourceError):
    """A requested offset range does not lie within the completed segments of its partition."""


class OffsetGapError(KafscaleSourceError):
    """Offsets inside a requested range are missing from storage (deleted before they were ingested)."""

    def __init__(self, message: str, *, gaps: Sequence[Gap] = ()):
        super().__init__(message)
        self.gaps = tuple(gaps)


class LfsResolutionError(KafscaleSourceError):
    """A record's LFS envelope or blob could not be handled (with onSegmentError=fail); names record and blob."""


class SegmentErrorMode(str, Enum):
    FAIL = "fail"
    MARK = "mark"


# ---------------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class StoreOptions:
    """Where the segments are: an S3 bucket (`kind="s3"`) or a local directory (`kind="local"`)."""

    kind: Literal["s3", "local"] = "s3"
    namespace: str = DEFAULT_NAMESPACE
    bucket: str | None = None
    endpoint: str | None = None
    region: str | None = None
    path_style: bool = False
    local_root: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind == "local":
            if not self.local_root:
                raise KafscaleOptionError("option localRoot is required with store=local")
            if self.bucket or self.endpoint or self.region or self.path_style or self.access_key_id \
                    or self.secret_access_key or self.session_token:
                raise KafscaleOptionError(f"options {', '.join(_S3_ONLY_OPTIONS)} apply to store=s3 only, "
                                          "not store=local")
        elif self.kind == "s3":
            if not self.bucket:
                raise KafscaleOptionError("option bucket is required with store=s3")
            if self.local_root:
                raise KafscaleOptionError("option localRoot applies to store=local only, not store=s3")
            if (self.access_key_id is None) != (self.secret_access_key is None):
                raise KafscaleOptionError("options s3.accessKeyId and s3.secretAccessKey go together (or neither, "
                                          "to use the AWS credential chain)")
        else:
            raise KafscaleOptionError(f"option store is {self.kind!r}; expected 's3' or 'local'")

    @classmethod
    def describing(cls, store: SegmentStore) -> StoreOptions:
        """The options that open a store like `store` (executors open their own; reads need no SSE settings)."""
        if isinstance(store, LocalSegmentStore):
            return cls(kind="local", namespace=store.namespace, local_root=str(store.root))
        if isinstance(store, S3SegmentStore):
            access_key_id, secret_access_key, session_token = store.static_credentials
            return cls(kind="s3", namespace=store.namespace, bucket=store.bucket, endpoint=store.endpoint,
                       region=store.region, path_style=store.path_style, access_key_id=access_key_id,
                       secret_access_key=secret_access_key, session_token=session_token)
        raise TypeError(f"no {KAFSCALE_FORMAT} source options for a {type(store).__name__}")

    def open(self) -> SegmentStore:
        if self.kind == "local":
            return LocalSegmentStore(self.local_root, namespace=self.namespace)
        return S3SegmentStore(self.bucket, namespace=self.namespace, endpoint=self.endpoint, region=self.region,
                              path_style=self.path_style, access_key_id=self.access_key_id,
                              secret_access_key=self.secret_access_key, session_token=self.session_token)

    def to_options(self) -> dict[str, str]:
        options = {"store": self.kind, "namespace": self.namespace}
        if self.kind == "local":
            options["localRoot"] = self.local_root
            return options
        options.update({"bucket": self.bucket, "pathStyle": "true" if self.path_style else "false"})
        for name, value in (("endpoint", self.endpoint), ("region", self.region),
                            ("s3.accessKeyId", self.access_key_id), ("s3.secretAccessKey", self.secret_access_key),
                            ("s3.sessionToken", self.session_token)):
            if value is not None:
                options[name] = value
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> StoreOptions:
        """From lower-cased option keys (as Spark passes them)."""
        path_style = options.get("pathstyle", "false").strip().lower()
        if path_style not in ("true", "false"):
            raise KafscaleOptionError(f"option pathStyle is {options['pathstyle']!r}; expected true or false")
        return cls(kind=options.get("store", "s3").strip().lower(),
                   namespace=options.get("namespace", DEFAULT_NAMESPACE), bucket=options.get("bucket"),
                   endpoint=options.get("endpoint"), region=options.get("region"), path_style=path_style == "true",
                   local_root=options.get("localroot"), access_key_id=options.get("s3.accesskeyid"),
                   secret_access_key=options.get("s3.secretaccesskey"),
                   session_token=options.get("s3.sessiontoken"))


@dataclass(frozen=True)
class KafscaleReadOptions:
    """Everything the source needs; `to_options()` gives the Spark options and `from_options()` parses them."""

    store: StoreOptions
    topic: str
    ending_offsets: Mapping[int, int]  # partition → exclusive end offset, or LATEST
    starting_offsets: Mapping[int, int] = field(default_factory=dict)  # partition → inclusive start, or EARLIEST
    columns: tuple[ColumnConfig, ...] = ()
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    on_segment_error: SegmentErrorMode = SegmentErrorMode.FAIL
    json_schema: CompiledJsonSchema | None = None  # validate every value against it (schema.mode lenient/strict)
    lfs: LfsReadSettings | None = None  # what to do with LFS envelope records

    def __post_init__(self) -> None:
        if not self.topic:
            raise KafscaleOptionError("option topic is required")
        if not self.ending_offsets:
            raise KafscaleOptionError(f"option endingOffsets names no partition of topic {self.topic!r}")
        if self.max_bytes_per_partition < 1:
            raise KafscaleOptionError(f"option maxBytesPerPartition is {self.max_bytes_per_partition}; "
                                      "it must be positive")
        extra = sorted(set(self.starting_offsets) - set(self.ending_offsets))
        if extra:
            raise KafscaleOptionError(f"option startingOffsets names partitions {extra} of topic {self.topic!r} that "
                                      "endingOffsets does not; endingOffsets lists the partitions to read")
        for partition, end in self.ending_offsets.items():
            start = self.starting_offsets.get(partition, EARLIEST)
            if partition < 0 or start < EARLIEST or start == LATEST or end < LATEST:
                raise KafscaleOptionError(
                    f"topic {self.topic!r} partition {partition}: offsets {start}..{end} are invalid (start >= 0 or "
                    f"{EARLIEST} = earliest, end >= 0 or {LATEST} = latest)")
            if start >= 0 and end >= 0 and start > end:
                raise KafscaleOptionError(f"topic {self.topic!r} partition {partition}: starting offset {start} is "
                                          f"after ending offset {end}")
        try:
            record_arrow_schema(self.columns)
        except SchemaMappingError as exc:
            raise KafscaleOptionError(f"option columns: {exc}") from exc
        if self.lfs is not None and self.lfs.config.store_metadata \
                and self.columns[-len(LFS_METADATA_COLUMNS):] != LFS_METADATA_COLUMNS:
            raise KafscaleOptionError("option lfs asks for store_metadata: option columns must end with the lfs_* "
                                      "columns (schema.columns.LFS_METADATA_COLUMNS)")

    def to_options(self) -> dict[str, str]:
        return {
            **self.store.to_options(),
            "topic": self.topic,
            "startingOffsets": _offsets_json(self.topic, self.starting_offsets),
            "endingOffsets": _offsets_json(self.topic, self.ending_offsets),
            "columns": json.dumps([column.model_dump() for column in self.columns]),
            "maxBytesPerPartition": str(self.max_bytes_per_partition),
            "onSegmentError": self.on_segment_error.value,
            **({"jsonSchema": json.dumps(self.json_schema.document), "jsonSchemaSource": self.json_schema.source}
               if self.json_schema is not None else {}),
            **({"lfs": self.lfs.to_option()} if self.lfs is not None else {}),
        }

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafscaleReadOptions:
        lowered = CaseInsensitiveDict(options)
        unknown = sorted(key for key in lowered if key not in _OPTION_NAMES)
        if unknown:
            raise KafscaleOptionError(f"unknown {KAFSCALE_FORMAT} source options {unknown}; known options: "
                                      f"{', '.join(_OPTION_NAMES.values())}")
        topic = lowered.get("topic", "")
        if not topic:
            raise KafscaleOptionError("option topic is required")
        if "endingoffsets" not in lowered:
            raise KafscaleOptionError("option endingOffsets is required (use -1 per partition for the latest "
                                      "completed segment)")
        mode = lowered.get("onsegmenterror", SegmentErrorMode.FAIL.value).strip().lower()
        if mode not in {m.value for m in SegmentErrorMode}:
            raise KafscaleOptionError(f"option onSegmentError is {mode!r}; expected 'fail' or 'mark'")
        return cls(
            store=StoreOptions.from_options(lowered),
            topic=topic,
            starting_offsets=_parse_offsets(lowered.get("startingoffsets", "{}"), "startingOffsets", topic),
            ending_offsets=_parse_offsets(lowered["endingoffsets"], "endingOffsets", topic),
            columns=_parse_columns(lowered.get("columns", "[]")),
            max_bytes_per_partition=_parse_int(lowered.get("maxbytesperpartition",
                                                           str(DEFAULT_MAX_BYTES_PER_PARTITION)),
                                               "maxBytesPerPartition"),
            on_segment_error=SegmentErrorMode(mode),
            json_schema=_parse_json_schema(lowered.get("jsonschema"), lowered.get("jsonschemasource")),
            lfs=_parse_lfs(lowered.get("lfs")),
        )


def _offsets_json(topic: str, offsets: Mapping[int, int]) -> str:
    return json.dumps({topic: {str(partition): offset for partition, offset in sorted(offsets.items())}})


def _parse_offsets(text: str, option: str, topic: str) -> dict[int, int]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KafscaleOptionError(f"option {option} is not JSON ({exc}); expected "
                                  '{"<topic>": {"<partition>": <offset>}}') from exc
    if not isinstance(document, dict) or not all(isinstance(v, dict) for v in document.values()):
        raise KafscaleOptionError(f'option {option} must be a JSON object {{"<topic>": {{"<partition>": <offset>}}}}')
    other_topics = sorted(set(document) - {topic})
    if other_topics:
        raise KafscaleOptionError(f"option {option} names topics {other_topics}; this source reads topic {topic!r} "
                                  "only")
    offsets = {}
    for partition_text, offset in document.get(topic, {}).items():
        if not partition_text.isdecimal() or type(offset) is not int:
            raise KafscaleOptionError(f"option {option}: entry {partition_text!r}: {offset!r} of topic {topic!r} must "
                                      "map a decimal partition id to an integer offset")
        offsets[int(partition_text)] = offset
    return offsets


def _parse_columns(text: str) -> tuple[ColumnConfig, ...]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KafscaleOptionError(f"option columns is not JSON ({exc})") from exc
    if not isinstance(document, list):
        raise KafscaleOptionError('option columns must be a JSON list of {"name", "type", "required"} objects')
    columns = []
    for index, item in enumerate(document):
        try:
            columns.append(ColumnConfig.model_validate(item))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, error['loc'])) or 'entry'}: {error['msg']}"
                                 for error in exc.errors())
            raise KafscaleOptionError(f"option columns[{index}]: {problems}") from None
    return tuple(columns)


def _parse_json_schema(text: str | None, source: str | None) -> CompiledJsonSchema | None:
    if text is None:
        if source is not None:
            raise KafscaleOptionError("option jsonSchemaSource is given without jsonSchema")
        return None
    source = source or "option jsonSchema"
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KafscaleOptionError(f"option jsonSchema (from {source}) is not JSON ({exc})") from exc
    try:
        return compile_json_schema(document, source)
    except InvalidSchemaDocumentError as exc:
        raise KafscaleOptionError(f"option jsonSchema: {exc}") from exc


def _parse_lfs(text: str | None) -> LfsReadSettings | None:
    if text is None:
        return None
    try:
        return LfsReadSettings.from_option(text)
    except (ValueError, ValidationError) as exc:
        raise KafscaleOptionError(f"option lfs is invalid: {exc}") from None


def _parse_int(text: str, option: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise KafscaleOptionError(f"option {option} is {text!r}; expected an integer") from None


# ----------------------------------------------------------------------------------------------------- schema


def source_arrow_schema(columns: Sequence[ColumnConfig], *, validated: bool = False) -> pa.Schema:
    """Base columns, mapped columns (nullable: invalid records keep nulls there), then `_kafscale_invalid_reason`,
    then (`validated`: the read has a `jsonSchema`) `_kafscale_invalid_schema_path`."""
    record_schema = record_arrow_schema(columns)
    mapped = [record_schema.field(name).with_nullable(True) for name in record_schema.names[len(BASE_SCHEMA):]]
    status = [pa.field(INVALID_REASON_COLUMN, pa.string(), nullable=True)]
    if validated:
        status.append(pa.field(INVALID_SCHEMA_PATH_COLUMN, pa.string(), nullable=True))
    return pa.schema([*BASE_SCHEMA, *mapped, *status])


def source_spark_schema(columns: Sequence[ColumnConfig], *, validated: bool = False) -> StructType:
    """The Spark schema of `source_arrow_schema` (Iceberg `timestamp` is Spark `timestamp_ntz`)."""
    return from_arrow_schema(source_arrow_schema(columns, validated=validated), prefer_timestamp_ntz=True)


# --------------------------------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class OffsetRange:
    start: int  # inclusive
    end: int  # exclusive

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"


@dataclass(frozen=True)
class SegmentRunPartition(InputPartition):
    """One Spark input partition: consecutive segments of one Kafka partition and the offsets to take from them."""

    topic: str
    partition: int
    offsets: OffsetRange
    segments: tuple[SegmentRef, ...]


@dataclass(frozen=True)
class ReadPlan:
    """`ranges`: the resolved range per Kafka partition (earliest/latest replaced by offsets); a partition with
    no completed segment whose start was `EARLIEST` has nothing to read and no range."""

    ranges: dict[int, OffsetRange]
    input_partitions: list[SegmentRunPartition]


def plan_read(store: SegmentStore, options: KafscaleReadOptions) -> ReadPlan:
    """Resolve the offset ranges and group the segments to read into input partitions (see module docstring)."""
    ranges: dict[int, OffsetRange] = {}
    input_partitions: list[SegmentRunPartition] = []
    for partition in sorted(options.ending_offsets):
        start = options.starting_offsets.get(partition, EARLIEST)
        resolved, segments = _plan_partition(store, options.topic, partition, start,
                                             options.ending_offsets[partition])
        if resolved is None:
            log.info("topic %s partition %d: no completed segment in %s, nothing to read", options.topic, partition,
                     store.location)
            continue
        ranges[partition] = resolved
        input_partitions.extend(segment_run_partitions(options.topic, partition, resolved, segments,
                                                       options.max_bytes_per_partition))
    log.info("kafscale read of topic %s from %s: ranges %s in %d input partitions (%d segments, %d bytes)",
             options.topic, store.location, {p: str(r) for p, r in ranges.items()}, len(input_partitions),
             sum(len(p.segments) for p in input_partitions),
             sum(s.kfs_size for p in input_partitions for s in p.segments))
    return ReadPlan(ranges, input_partitions)


def _plan_partition(store: SegmentStore, topic: str, partition: int, start: int,
                    end: int) -> tuple[OffsetRange | None, list[SegmentRef]]:
    if start >= 0 and start == end:
        return OffsetRange(start, end), []
    segments, incomplete = _segments_from(store, topic, partition, start, end)
    # Operators need to know why the log "ends" early: an upload in flight, or a broker that died mid-upload.
    not_complete = f"; not complete: {incomplete[0].kfs_key or incomplete[0].index_key}: {incomplete[0].reason}" \
        if incomplete else ""
    if start == EARLIEST:
        if not segments:
            if end == LATEST:
                return None, []
            raise OffsetRangeError(f"topic {topic} partition {partition}: no completed segment in {store.location} "
                                   f"holds offsets below the ending offset {end}{not_complete}")
        start = segments[0].base_offset
    available_end = segments[-1].last_offset + 1 if segments else None
    if end == LATEST:
        if available_end is not None and start > available_end:
            raise OffsetRangeError(f"topic {topic} partition {partition}: starting offset {start} is beyond the "
                                   f"end of the latest completed segment ({available_end}) in {store.location}")
        end = available_end if available_end is not None else start
    offsets = OffsetRange(start, end)
    if start == end:
        return offsets, []
    if available_end is None or available_end < end:
        have = f"completed segments end at offset {available_end}" if available_end is not None else \
            "there is no completed segment at or after the starting offset"
        raise OffsetRangeError(f"topic {topic} partition {partition}: ending offset {end} is beyond the completed "
                               f"segments in {store.location} ({have}{not_complete})")
    in_range = [segment for segment in segments if segment.last_offset >= start and segment.base_offset < end]
    gaps = find_gaps(in_range)
    # The first segment reaching `start` must hold it (it may begin at or beyond `end` when a gap spans the range).
    first = next(segment for segment in segments if segment.last_offset >= start)
    if first.base_offset > start:
        gaps.insert(0, Gap(topic, partition, start, first.base_offset, first.kfs_key))
    if gaps:
        raise OffsetGapError(f"topic {topic} partition {partition}: offsets missing from {store.location} inside "
                             f"the requested range {offsets}: " + "; ".join(map(str, gaps)), gaps=gaps)
    return offsets, in_range


def _segments_from(store: SegmentStore, topic: str, partition: int, start: int,
                   end: int) -> tuple[list[SegmentRef], list[IncompleteSegment]]:
    """Completed segments from the one holding `start` (the first one for EARLIEST) up to the one holding `end - 1`,
    and the incomplete segments seen after them.

    One key listing gives every base offset; `list_segments` then resumes after the segment before the one holding
    `start` and stops after the last base offset below `end`, so footers are read only for segments that matter.
    """
    prefix = partition_prefix(store.namespace, topic, partition)
    parsed_keys = (parse_segment_key(info.key, store.namespace) for info in store.list_objects(prefix))
    bases = sorted({parsed.base_offset for parsed in parsed_keys if parsed is not None})
    first = max((base for base in bases if base <= start), default=None) if start != EARLIEST else None
    earlier = [base for base in bases if base < first] if first is not None else []
    after = segment_key(store.namespace, topic, partition, earlier[-1], ObjectKind.SEGMENT) if earlier else None
    limit = None
    if end != LATEST:
        limit = sum(1 for base in bases if (first is None or base >= first) and base < end)
        if limit == 0:
            return [], []
    listing = store.list_segments(topic, partition, after=after, limit=limit)
    return listing.segments, listing.incomplete


def segment_run_partitions(topic: str, partition: int, offsets: OffsetRange, segments: Sequence[SegmentRef],
                           max_bytes: int) -> list[SegmentRunPartition]:
    """Consecutive `segments` grouped into input partitions of at most `max_bytes` of segment bytes each (a larger
    segment gets one of its own), each taking the offsets of `offsets` that its segments hold."""
    runs: list[list[SegmentRef]] = []
    run_bytes = 0
    for segment in segments:
        if not runs or run_bytes + segment.kfs_size > max_bytes:
            runs.append([])
            run_bytes = 0
        runs[-1].append(segment)
        run_bytes += segment.kfs_size
    return [SegmentRunPartition(topic, partition,
                                OffsetRange(max(offsets.start, run[0].base_offset),
                                            min(offsets.end, run[-1].last_offset + 1)), tuple(run))
            for run in runs]


# ---------------------------------------------------------------------------------------------------- reading


def read_input_partition(store: SegmentStore, partition: SegmentRunPartition, columns: Sequence[ColumnConfig],
                         on_segment_error: SegmentErrorMode = SegmentErrorMode.FAIL,
                         json_schema: CompiledJsonSchema | None = None, lfs: LfsReadSettings | None = None,
                         lfs_stats: LfsStats | None = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches (`source_arrow_schema(columns, validated=json_schema is not None)`) of the records of
    `partition`, in offset order, each value validated against `json_schema` when given; with `lfs`, envelope
    records handled first (what they did is added to `lfs_stats`)."""
    schema = source_arrow_schema(columns, validated=json_schema is not None)
    if lfs is None:
        yield from _read_segments(store, partition, columns, on_segment_error, json_schema, schema, None)
        return
    resolver = LfsResolver(lfs, store, lfs_stats)
    try:
        yield from _read_segments(store, partition, columns, on_segment_error, json_schema, schema, resolver)
    finally:
        resolver.close()


def _read_segments(store: SegmentStore, partition: SegmentRunPartition, columns: Sequence[ColumnConfig],
                   on_segment_error: SegmentErrorMode, json_schema: CompiledJsonSchema | None, schema: pa.Schema,
                   resolver: LfsResolver | None) -> Iterator[pa.RecordBatch]:
    lfs_columns = resolver is not None and resolver.settings.config.store_metadata
    coercer = JsonColumnCoercer(columns[:-len(LFS_METADATA_COLUMNS)] if lfs_columns else columns)
    for segment in partition.segments:
        try:
            records = fetch_segment_records(store, segment, partition.offsets)
        except (SegmentFormatError, StorageError) as exc:
            if on_segment_error is SegmentErrorMode.FAIL:
                raise
            next_offset = max(segment.base_offset, partition.offsets.start)
            log.error("topic %s partition %d stops at offset %d: %s", partition.topic, partition.partition,
                      next_offset, exc)
            yield _error_marker_batch(schema, segment, next_offset, exc)
            return
        for batch in records.to_batches(max_chunksize=MAX_ROWS_PER_BATCH):
            if resolver is None:
                yield _with_mapped_columns(batch, coercer, schema, json_schema)
                continue
            for handled in resolver.process(batch):
                if handled.batch.num_rows:
                    yield _with_mapped_columns(handled.batch, coercer, schema, json_schema, handled.metadata,
                                               handled.invalid_reasons)
                if handled.stop is not None:
                    failure = handled.stop
                    if on_segment_error is SegmentErrorMode.FAIL:
                        raise LfsResolutionError(failure.describe())
                    log.error("topic %s partition %d stops at offset %d: %s", partition.topic, partition.partition,
                              failure.offset, failure.describe())
                    yield _lfs_error_marker_batch(schema, segment, failure)
                    return


def fetch_segment_records(store: SegmentStore, segment: SegmentRef, offsets: OffsetRange) -> pa.Table:
    """The records of `segment` within `offsets` (BASE_SCHEMA), fetched once and decoded with CRC checks.

    When `offsets.start` falls mid-way, only the bytes from the index entry at or before it are fetched; then the
    batch CRCs are verified but not the footer's body CRC, which covers bytes that were not fetched.
    """
    if offsets.start > segment.base_offset:
        entries = parse_index(store.read(segment.index_key), key=segment.index_key)
        entry = entry_for_offset(entries, offsets.start)
        if entry.position > HEADER_SIZE:
            entry_position = INDEX_HEADER_SIZE + entries.index(entry) * INDEX_ENTRY_SIZE
            return _decode_from_index_entry(store, segment, offsets, entry.offset, entry.position, entry_position)
    decoded = decode_segment(store.read(segment.kfs_key), key=segment.kfs_key, topic=segment.topic,
                             partition=segment.partition, start_offset=offsets.start, end_offset=offsets.end)
    return decoded.records


def _decode_from_index_entry(store: SegmentStore, segment: SegmentRef, offsets: OffsetRange, entry_offset: int,
                             byte_position: int, entry_position: int) -> pa.Table:
    """Range-read and decode the batches from `byte_position` (an index entry for `entry_offset`) to the footer."""
    footer_position = segment.kfs_size - FOOTER_SIZE
    if byte_position >= footer_position:
        raise BadIndexError(segment.index_key, entry_position,
                            f"index entry (offset {entry_offset}, byte {byte_position}) points at or past the footer "
                            f"of {segment.kfs_key} (byte {footer_position})")
    data = store.read_range(segment.kfs_key, byte_position, segment.kfs_size - byte_position)
    footer = parse_footer(data[-FOOTER_SIZE:], segment.kfs_key, footer_position)
    decoded = decode_batches(memoryview(data)[:-FOOTER_SIZE], key=segment.kfs_key, position=byte_position,
                             topic=segment.topic, partition=segment.partition, start_offset=offsets.start,
                             end_offset=offsets.end)
    first_batch, last_batch = decoded.batches[0], decoded.batches[-1]
    if first_batch.base_offset != entry_offset:
        raise BadIndexError(segment.index_key, entry_position,
                            f"index entry says offset {entry_offset} starts at byte {byte_position} of "
                            f"{segment.kfs_key}, the batch there starts at offset {first_batch.base_offset}")
    if last_batch.last_offset != footer.last_offset:
        raise SegmentMismatchError(segment.kfs_key, footer_position + 4,
                                   f"footer last offset is {footer.last_offset}, the last batch ends at offset "
                                   f"{last_batch.last_offset}")
    return decoded.records


def _with_mapped_columns(batch: pa.RecordBatch, coercer: JsonColumnCoercer, schema: pa.Schema,
                         json_schema: CompiledJsonSchema | None, lfs_metadata: Mapping[str, pa.Array] | None = None,
                         lfs_reasons: pa.Array | None = None) -> pa.RecordBatch:
    result = coercer.coerce(batch.column("value"))
    column_reasons = pc.binary_join_element_wise(result.invalid_column, result.invalid_reason, ": ")
    reasons = pc.coalesce(column_reasons, result.invalid_reason)
    mapped = [result.columns[column.name] for column in coercer.columns] + list((lfs_metadata or {}).values())
    status = [reasons]
    if json_schema is not None:
        violations = validate_values(batch.column("value"), batch.column("record_id"), json_schema)
        # The schema violation names the record's fault as the producer's contract states it, so it wins.
        status = [pc.coalesce(violations.reasons(), reasons), _schema_paths(violations)]
    if lfs_reasons is not None:  # the value is still the envelope of a blob that failed: that is the fault
        status[0] = pc.coalesce(lfs_reasons, status[0])
        if len(status) > 1:
            status[1] = pc.if_else(pc.is_valid(lfs_reasons), pa.scalar(None, pa.string()), status[1])
    return pa.RecordBatch.from_arrays([*batch.columns, *mapped, *status], schema=schema)


def _schema_paths(violations: ValidationResult) -> pa.StringArray:
    paths: list[str | None] = [None] * violations.record_count
    for record in violations.invalid_records:
        paths[record.row] = record.schema_path
    return pa.array(paths, type=pa.string())


# ---------------------------------------------------------------------------------------------- error markers


@dataclass(frozen=True)
class SegmentReadFailure:
    """A parsed error-marker row: why `topic`/`partition` stopped at `next_offset`."""

    topic: str
    partition: int
    kfs_key: str
    key: str  # the object at fault (`.kfs` or `.index`)
    position: int | None  # byte offset in `key`; None for storage errors
    error_type: str
    message: str
    base_offset: int  # of the failing segment
    next_offset: int  # first offset of the partition not delivered


def _error_marker_batch(schema: pa.Schema, segment: SegmentRef, next_offset: int,
                        exc: SegmentFormatError | StorageError) -> pa.RecordBatch:
    description = {
        "key": exc.key or segment.kfs_key,
        "position": exc.position if isinstance(exc, SegmentFormatError) else None,
        "error_type": type(exc).__name__,
        "message": str(exc),
        "base_offset": segment.base_offset,
        "next_offset": next_offset,
    }
    values = {"record_id": segment.kfs_key, "topic": segment.topic, "partition": segment.partition,
              "offset": ERROR_MARKER_OFFSET, "timestamp_ms": 0,
              "value": json.dumps(description, separators=(",", ":")).encode()}
    return pa.RecordBatch.from_arrays([pa.array([values.get(f.name)], f.type) for f in schema], schema=schema)


def _lfs_error_marker_batch(schema: pa.Schema, segment: SegmentRef, failure: LfsFailure) -> pa.RecordBatch:
    """An error marker (as for a failing segment) for a record whose LFS envelope or blob failed."""
    description = {
        "key": failure.location or failure.record_id,
        "position": None,
        "error_type": LFS_ERROR_TYPE,
        "message": failure.describe(),
        "base_offset": segment.base_offset,
        "next_offset": failure.offset,
    }
    values = {"record_id": segment.kfs_key, "topic": segment.topic, "partition": segment.partition,
              "offset": ERROR_MARKER_OFFSET, "timestamp_ms": 0,
              "value": json.dumps(description, separators=(",", ":")).encode()}
    return pa.RecordBatch.from_arrays([pa.array([values.get(f.name)], f.type) for f in schema], schema=schema)


def is_error_marker(batch: pa.RecordBatch | pa.Table) -> pa.BooleanArray | pa.ChunkedArray:
    """Per row: is it an error marker (`offset == ERROR_MARKER_OFFSET`)? Like `pc.is_null`, one boolean per row."""
    return pc.equal(batch.column("offset"), ERROR_MARKER_OFFSET)


def error_markers(batch: pa.RecordBatch | pa.Table) -> list[SegmentReadFailure]:
    """The error markers among the rows of `batch`, parsed."""
    markers = batch.select(["topic", "partition", "record_id", "value"]).filter(is_error_marker(batch))
    failures = []
    for row in markers.to_pylist():
        description = json.loads(row["value"])
        failures.append(SegmentReadFailure(topic=row["topic"], partition=row["partition"], kfs_key=row["record_id"],
                                           **description))
    return failures


# ------------------------------------------------------------------------------------------------ Spark glue


class KafscaleDataSource(DataSource):
    """`spark.read.format("kafscale")`; options in the module docstring."""

    @classmethod
    def name(cls) -> str:
        return KAFSCALE_FORMAT

    def schema(self) -> StructType:
        read_options = KafscaleReadOptions.from_options(self.options)
        return source_spark_schema(read_options.columns, validated=read_options.json_schema is not None)

    def reader(self, schema: StructType) -> KafscaleReader:
        read_options = KafscaleReadOptions.from_options(self.options)
        expected = source_spark_schema(read_options.columns, validated=read_options.json_schema is not None)
        if schema != expected:
            raise KafscaleOptionError(f"the {KAFSCALE_FORMAT} source's schema follows its columns and jsonSchema "
                                      f"options ({expected.simpleString()}); a different schema was given "
                                      f"({schema.simpleString()})")
        return KafscaleReader(read_options)


class KafscaleReader(DataSourceReader):
    def __init__(self, read_options: KafscaleReadOptions):
        self.read_options = read_options
        self.store = read_options.store.open()

    def partitions(self) -> list[SegmentRunPartition]:
        return plan_read(self.store, self.read_options).input_partitions

    def read(self, partition: SegmentRunPartition) -> Iterator[pa.RecordBatch]:
        return read_input_partition(self.store, partition, self.read_options.columns,
                                    self.read_options.on_segment_error, self.read_options.json_schema,
                                    self.read_options.lfs)


def register_kafscale_source(spark: SparkSession) -> None:
    """Make `spark.read.format("kafscale")` available in `spark` (once per session)."""
    if spark not in _sessions_with_source:
        spark.dataSource.register(KafscaleDataSource)
        _sessions_with_source.add(spark)


def read_kafscale(spark: SparkSession, read_options: KafscaleReadOptions) -> DataFrame:
    """A DataFrame of the records `read_options` asks for (lazy: planning and reading happen on an action)."""
    register_kafscale_source(spark)
    return spark.read.format(KAFSCALE_FORMAT).options(**read_options.to_options()).load()
