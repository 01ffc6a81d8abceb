"""`mappings[].topic_pattern`: its config rules (naming the key) and its resolution against the topics that exist."""

from __future__ import annotations

import pytest

from kafscale_lakehouse.config import ConfigError, parse_config, resolve_topic_patterns

BASE = {
    "s3": {"bucket": "kafscale-data"},
    "iceberg": {"catalog": {"type": "rest", "uri": "http://catalog:8181"}},
    "etcd": {"endpoints": ["http://etcd:2379"]},
}


def config_with(*mappings: dict):
    return parse_config({**BASE, "mappings": list(mappings)})


def problems_of(*mappings: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config_with(*mappings)
    return caught.value.problems


def test_pattern_rules_name_the_key():
    problems = problems_of(
        {"topic": "orders", "topic_pattern": "orders-.*", "table": "raw.{topic}"},
        {"topic_pattern": "clicks-(", "table": "raw.{topic}"},
        {"topic_pattern": "events-.*", "table": "raw.events"},
        {"topic_pattern": "logs-.*", "table": "raw.{topic}", "dead_letter_table": "raw.dead"},
        {"table": "raw.nothing"},
        {"topic_pattern": "audit-.*", "table": "raw.{topic}_{part}"},
    )
    assert any(p.startswith("mappings[0].topic_pattern: and topic both say") for p in problems), problems
    assert any(p.startswith("mappings[1].topic_pattern: 'clicks-(' is not a regular expression") for p in problems)
    assert any(p.startswith("mappings[2].table: 'raw.events' must hold {topic}") for p in problems), problems
    assert any(p.startswith("mappings[3].dead_letter_table: 'raw.dead' must hold {topic}") for p in problems)
    assert any(p.startswith("mappings[4].topic: is required") for p in problems), problems
    assert any(p.startswith("mappings[5].table:") and "only placeholder" in p for p in problems), problems
    assert len(problems) == 6, problems


def test_loaded_config_keeps_patterns_apart_and_resolution_applies_the_template():
    config = config_with(
        {"topic": "orders-eu", "table": "prod.orders_eu"},
        {"topic_pattern": "orders-.*", "table": "raw.{topic}", "create_table_if_missing": True,
         "schema": {"columns": [{"name": "id", "type": "long", "required": True}]},
         "maintenance": {"cron_schedule": "5 * * * *"}, "dead_letter_table": "raw.{topic}_dead"},
    )
    # Callers that do not resolve patterns never see a mapping without its topic.
    assert [m.topic for m in config.mappings] == ["orders-eu"]
    assert [(index, m.topic_pattern) for index, m in config.pattern_mappings] == [(1, "orders-.*")]

    resolution = resolve_topic_patterns(config, ["orders-eu", "orders-us", "orders.v1", "clicks", "orders-"])
    assert resolution.problems == []
    by_topic = {m.topic: m for m in resolution.config.mappings}
    # The explicit mapping wins; the pattern is a full match (`clicks` is not landed); `.`/`-` escaped as Dagster names.
    assert sorted(by_topic) == ["orders-", "orders-eu", "orders-us"]
    assert by_topic["orders-eu"].table == "prod.orders_eu"
    assert by_topic["orders-us"].table == "raw.orders_dash_us"
    assert by_topic["orders-us"].dead_letter_table == "raw.orders_dash_us_dead"
    assert by_topic["orders-us"].topic_pattern is None
    assert [c.name for c in by_topic["orders-us"].columns] == ["id"]
    assert by_topic["orders-us"].create_table_if_missing is True
    assert by_topic["orders-us"].maintenance.cron_schedule == "5 * * * *"
    assert by_topic["orders-us"].allow_gaps is False  # resolved defaults are carried over
    assert resolution.pattern_of == {"orders-": "mappings[1].topic_pattern", "orders-us": "mappings[1].topic_pattern"}
    # The loaded config is left as it was.
    assert [m.topic for m in config.mappings] == ["orders-eu"]
    assert resolution.config.pattern_mappings == config.pattern_mappings


def test_two_patterns_matching_one_topic_is_an_error_naming_both():
    config = config_with(
        {"topic_pattern": "orders-.*", "table": "raw.{topic}"},
        {"topic_pattern": ".*-eu", "table": "eu.{topic}"},
    )
    resolution = resolve_topic_patterns(config, ["orders-eu", "orders-us", "clicks-eu"])
    assert sorted(m.topic for m in resolution.config.mappings) == ["clicks-eu", "orders-us"]
    assert len(resolution.problems) == 1
    problem = resolution.problems[0]
    assert "'orders-eu'" in problem
    assert "mappings[0].topic_pattern 'orders-.*'" in problem and "mappings[1].topic_pattern '.*-eu'" in problem


def test_topic_whose_table_is_taken_is_left_out_naming_it():
    config = config_with(
        {"topic": "x", "table": "raw.ok"},
        {"topic_pattern": ".*", "table": "raw.{topic}"},
        {"topic_pattern": "y.*", "table": "raw.t_{topic}", "dead_letter_table": "dl.{topic}"},
    )
    resolution = resolve_topic_patterns(config, ["2024-orders", "x", "ok"])
    assert {m.topic: m.table for m in resolution.config.mappings} == {
        "x": "raw.ok", "2024-orders": "raw.2024_dash_orders"}
    assert len(resolution.problems) == 1
    assert resolution.problems[0].startswith("mappings[1].table: topic 'ok' would land in 'raw.ok', already ")


def test_config_without_patterns_resolves_to_itself():
    config = config_with({"topic": "orders", "table": "prod.orders"})
    assert resolve_topic_patterns(config, ["orders", "other"]).config is config
