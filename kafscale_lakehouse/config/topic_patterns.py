"""`mappings[].topic_pattern`: one mapping for every topic a regular expression matches, resolved against the topics
that exist (the caller discovers them: engine/ingestion/topic_patterns.py).

Each matched topic gets a mapping of its own: the pattern mapping's keys (columns, validation, LFS, maintenance...)
with `topic` set and `{topic}` in `table` and `dead_letter_table` replaced by the topic escaped as Dagster names
escape it (`name_part`: `orders-eu` -> `orders_dash_eu`, `orders.v1` -> `orders_dot_v1`, `_` doubled), so two topics
never share a table. An explicit mapping of a topic wins over any pattern. A topic that two patterns match, or whose
table is not an identifier or is another mapping's table, is left out and reported as a problem naming the keys.
Pure: no I/O here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from kafscale_lakehouse.config.models import LakehouseConfig, MappingConfig
from kafscale_lakehouse.config.rules import TOPIC_PLACEHOLDER, table_identifier_problem

# `_` is doubled so that the `_dot_`/`_dash_` escapes cannot be produced by a name that contained them literally.
_ESCAPES = {"_": "__", ".": "_dot_", "-": "_dash_"}


def name_part(text: str) -> str:
    """`text` (a Kafka topic or a table identifier) as an injective name fragment of letters, digits and `_`:
    `completed-pizzas` -> `completed_dash_pizzas`. Dagster names and pattern-mapped table names both use it."""
    escaped = []
    for char in text:
        if char in _ESCAPES:
            escaped.append(_ESCAPES[char])
        elif char.isascii() and char.isalnum():
            escaped.append(char)
        else:
            raise ValueError(f"{text!r}: character {char!r} cannot appear in a Kafka topic or table identifier")
    return "".join(escaped)


def table_for_topic(template: str, topic: str) -> str:
    """The table of `topic` under a `table` template: `raw.{topic}`, `orders-eu` -> `raw.orders_dash_eu`."""
    return template.replace(TOPIC_PLACEHOLDER, name_part(topic))


@dataclass(frozen=True)
class TopicPatternResolution:
    """`config` with a mapping per matched topic after its explicit mappings; `pattern_of` says which pattern mapping
    (`mappings[i].topic_pattern`) each of those topics came from; `problems` the topics left out, and why."""

    config: LakehouseConfig
    pattern_of: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def pattern_topics(self) -> list[str]:
        return sorted(self.pattern_of)


def resolve_topic_patterns(config: LakehouseConfig, topics: Iterable[str]) -> TopicPatternResolution:
    """The mappings of `config` with its `topic_pattern` mappings applied to `topics` (the topics that exist)."""
    if not config.pattern_mappings:
        return TopicPatternResolution(config)
    explicit_topics = {m.topic for m in config.mappings}
    tables = {m.table: f"the table of topic {m.topic!r}" for m in config.mappings}
    tables.update({m.dead_letter_table: f"the dead-letter table of topic {m.topic!r}"
                   for m in config.mappings if m.dead_letter_table is not None})
    compiled = [(f"mappings[{index}]", re.compile(mapping.topic_pattern or ""), mapping)
                for index, mapping in config.pattern_mappings]
    resolved: list[MappingConfig] = []
    pattern_of: dict[str, str] = {}
    problems: list[str] = []
    for topic in sorted(set(topics) - explicit_topics):
        matches = [(at, mapping) for at, pattern, mapping in compiled if pattern.fullmatch(topic)]
        if not matches:
            continue
        if len(matches) > 1:
            named = " and ".join(f"{at}.topic_pattern {m.topic_pattern!r}" for at, m in matches)
            problems.append(f"topic {topic!r} matches {named}; map the topic explicitly (an explicit mapping wins) "
                            "or make the patterns exclusive. It is not landed until then")
            continue
        at, pattern_mapping = matches[0]
        mapping = _mapping_of_topic(pattern_mapping, topic)
        clash = _table_problem(at, topic, mapping, tables)
        if clash is not None:
            problems.append(clash)
            continue
        tables[mapping.table] = f"the table of topic {topic!r}"
        if mapping.dead_letter_table is not None:
            tables[mapping.dead_letter_table] = f"the dead-letter table of topic {topic!r}"
        resolved.append(mapping)
        pattern_of[topic] = f"{at}.topic_pattern"
    return TopicPatternResolution(config.model_copy(update={"mappings": [*config.mappings, *resolved]}),
                                  pattern_of, problems)


def _mapping_of_topic(pattern_mapping: MappingConfig, topic: str) -> MappingConfig:
    dead_letter = pattern_mapping.dead_letter_table
    return pattern_mapping.model_copy(deep=True, update={
        "topic": topic, "topic_pattern": None, "table": table_for_topic(pattern_mapping.table, topic),
        "dead_letter_table": None if dead_letter is None else table_for_topic(dead_letter, topic)})


def _table_problem(at: str, topic: str, mapping: MappingConfig, tables: dict[str, str]) -> str | None:
    for key, table in (("table", mapping.table), ("dead_letter_table", mapping.dead_letter_table)):
        if table is None:
            continue
        reason = table_identifier_problem(table)
        if reason is not None:
            return (f"{at}.{key}: topic {topic!r} would land in a table that cannot be mapped: {reason}; map the "
                    "topic explicitly. It is not landed until then")
        if table in tables:
            return (f"{at}.{key}: topic {topic!r} would land in {table!r}, already {tables[table]}; map the topic "
                    "explicitly. It is not landed until then")
    return None
