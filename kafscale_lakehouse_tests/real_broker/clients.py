"""Real Kafka clients against KafScale's broker, and what they were acknowledged."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from kafscale_lakehouse.apps.workload import ALL_CODECS

# Every compression librdkafka offers; KafScale stores each batch as the client compressed it.
COMPRESSIONS = ALL_CODECS
BASE_TIMESTAMP_MS = 1_790_000_000_000


@dataclass(frozen=True)
class Outgoing:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


@dataclass(frozen=True)
class Acked:
    """A record and where the broker said it put it."""

    record: Outgoing
    offset: int
    compression: str

    @property
    def partition(self) -> int:
        return self.record.partition


def records(count: int, partitions: int, *, seed: int, max_value_bytes: int = 2_000,
            large_every: int = 0, large_bytes: int = 0) -> list[Outgoing]:
    """`count` records over `partitions`: keys (every 7th null), values of mixed sizes (every 5th null; every
    `large_every`-th of `large_bytes`), several headers each with their own values, duplicate names, a null value,
    non-ASCII and bytes that are not UTF-8, and timestamps of their own (CreateTime)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if large_every and i % large_every == large_every - 1:
            value = rng.randbytes(large_bytes // 2) + b"z" * (large_bytes - large_bytes // 2)
        elif i % 5 == 4:
            value = None
        else:
            value = rng.randbytes(rng.randrange(0, max_value_bytes))
        headers = [("trace", f"t-{seed}-{i}".encode()), ("dup", b"first"), ("dup", b"second <&>"),
                   ("nothing", None), ("grüße", "naïve ✓".encode()), ("raw", bytes([0xFF, 0x00, i % 256]))]
        out.append(Outgoing(partition=i % partitions, key=None if i % 7 == 3 else f"key-{seed}-{i}".encode(),
                            value=value, headers=tuple(headers[: 1 + i % len(headers)]),
                            timestamp_ms=BASE_TIMESTAMP_MS + seed * 1_000_000 + i))
    return out


def produce(bootstrap: str, topic: str, outgoing: Sequence[Outgoing], *, compression: str,
            **settings: object) -> list[Acked]:
    """Produce with librdkafka (confluent-kafka) using `compression`, acks=all; returns every acknowledged record.
    A record the broker did not acknowledge fails the test."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": compression, "acks": "all",
                         "linger.ms": 20, "enable.idempotence": False, "message.max.bytes": 4_000_000,
                         **settings})
    acked: list[Acked] = []
    failures: list[str] = []

    def delivered(error, message, record: Outgoing) -> None:
        if error is not None:
            failures.append(f"{record.partition}/{record.key!r}: {error}")
        else:
            acked.append(Acked(record, message.offset(), compression))

    for record in outgoing:
        producer.produce(topic, value=record.value, key=record.key, partition=record.partition,
                         headers=list(record.headers), timestamp=record.timestamp_ms,
                         on_delivery=lambda error, message, record=record: delivered(error, message, record))
        producer.poll(0)
    left = producer.flush(60)
    if failures or left:
        raise KafkaException(f"{topic}: {len(failures)} records failed ({failures[:3]}), {left} not delivered")
    return acked


def produce_all_compressions(bootstrap: str, topic: str, outgoing: Sequence[Outgoing],
                             compressions: Iterable[str] = COMPRESSIONS) -> list[Acked]:
    """`outgoing` split over one producer per compression, one after the other."""
    compressions = tuple(compressions)
    acked: list[Acked] = []
    for index, compression in enumerate(compressions):
        acked += produce(bootstrap, topic, outgoing[index::len(compressions)], compression=compression)
    return acked


def produce_with_kafka_python(bootstrap: str, topic: str, outgoing: Sequence[Outgoing], *,
                              compression: str) -> list[Acked]:
    """Produce with kafka-python, acks=all, one partition after the other. KafScale v1.5.0 cannot parse a flexible
    Produce request (v9+, which kafka-python negotiates) holding more than one partition (it skips the partitions'
    tagged fields after the partition loop instead of in it, then drops the connection unanswered), so each request
    here holds one partition (flushed before the next). Its default idempotent producer needs InitProducerId, which
    KafScale does not serve, so idempotence is off; it takes no null header value, so those are sent empty."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, enable_idempotence=False,
                             compression_type=None if compression == "none" else compression,
                             max_request_size=4_000_000)
    try:
        sent = []
        for partition in sorted({record.partition for record in outgoing}):
            for record in outgoing:
                if record.partition != partition:
                    continue
                headers = tuple((name, b"" if value is None else value) for name, value in record.headers)
                record = Outgoing(record.partition, record.key, record.value, headers, record.timestamp_ms)
                sent.append((record, producer.send(topic, key=record.key, value=record.value, partition=partition,
                                                   headers=list(headers), timestamp_ms=record.timestamp_ms)))
            producer.flush(60)
        return [Acked(record, future.get(timeout=60).offset, compression) for record, future in sent]
    finally:
        producer.close(timeout=10)
