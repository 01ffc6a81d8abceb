"""Dagster names derived from topics and tables: valid, and never shared by two different topics or tables."""

from __future__ import annotations

import re

import dagster as dg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale_lakehouse.orchestration.naming import (
    dagster_name_part,
    ingest_job_name,
    kafka_partition_id,
    kafka_partition_key,
    partitions_def_name,
    pool_name,
    table_asset_key,
    topic_asset_key,
    topic_partitions_def,
)

DAGSTER_NAME = re.compile(r"^[A-Za-z0-9_]+$")
topics = st.text(alphabet="ab._-", min_size=1, max_size=12)


def test_names_of_the_demo_mapping():
    assert table_asset_key("rpc.pizzas") == dg.AssetKey(["rpc", "pizzas"])
    assert topic_asset_key("completed-pizzas") == dg.AssetKey(["kafscale", "completed-pizzas"])
    assert partitions_def_name("completed-pizzas") == "kafscale_completed_dash_pizzas_partitions"
    assert ingest_job_name("rpc.pizzas") == "ingest_rpc_dot_pizzas"
    assert pool_name("rpc.pizzas") == "kafscale_rpc_dot_pizzas"
    assert topic_partitions_def("orders.v1").name == partitions_def_name("orders.v1")


@given(topics, topics)
def test_topic_names_are_valid_and_injective(first, second):
    for topic in (first, second):
        assert DAGSTER_NAME.match(partitions_def_name(topic))
        dg.DynamicPartitionsDefinition(name=partitions_def_name(topic))  # Dagster accepts it
    if first != second:
        assert partitions_def_name(first) != partitions_def_name(second)
        assert ingest_job_name(first) != ingest_job_name(second)


def test_pool_names_never_collide():
    # `.` -> `_` (the old form) gave both tables the pool `kafscale_a_b_c`: their commits serialized each other.
    assert pool_name("a.b_c") != pool_name("a_b.c")


@given(topics, topics)
def test_pool_names_are_injective(first, second):
    if first != second:
        assert pool_name(first) != pool_name(second)


def test_topics_that_differ_only_in_separators_get_different_names():
    names = {dagster_name_part(t) for t in ("orders.v1", "orders-v1", "orders_v1", "orders__v1", "orders_dot_v1")}
    assert len(names) == 5


def test_a_character_no_topic_may_hold_is_an_error_naming_the_text():
    with pytest.raises(ValueError, match="'a/b'"):
        dagster_name_part("a/b")


def test_partition_keys_round_trip_and_reject_non_ids():
    assert kafka_partition_id(kafka_partition_key(17)) == 17
    for bad in ("-1", "x", "", "²"):
        with pytest.raises(ValueError, match="is not a Kafka partition id"):
            kafka_partition_id(bad)
