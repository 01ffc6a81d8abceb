"""Topics that appear while the deployment runs: the sensor that onboards them into a `topic_pattern` mapping.

Each table stays an asset of its own (its key is the table, its partitions the topic's Kafka partitions), so a new
topic is a new asset, which Dagster's dynamic partitions cannot add: the code location has to load again. The code
location builds its definitions from the config and the topics that exist when it loads
(`engine.ingestion.with_pattern_topics`); this sensor lists the topics (one discovery request per tick, every
`TOPIC_PATTERN_SENSOR_INTERVAL_SECONDS` at least), and when a topic matches a pattern but has no asset yet, it asks
the webserver to reload the code location (GraphQL `reloadRepositoryLocation`, what the UI's "Reload" does; the
daemon follows the reloaded code server). After the reload the topic's sensor and table asset exist and its rows
land exactly once like any mapped topic's. Without a webserver address (`KafscaleLakehouseComponent.webserver_url`,
or `$KAFSCALE_LAKEHOUSE_WEBSERVER_URL`) the sensor says which topics wait for a reload.

The reload is requested from a background thread: the webserver's reload replaces the very process this sensor runs
in, so the tick returns at once and the next ticks see whether it took. It is requested again after
`RELOAD_RETRY_SECONDS` while the topics still have no asset.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import urlparse

import dagster as dg

from kafscale_lakehouse.config import LakehouseConfig, TopicPatternResolution
from kafscale_lakehouse.connections import etcd_client_from_config, segment_store_from_config
from kafscale_lakehouse.engine.ingestion.topic_patterns import with_pattern_topics

log = logging.getLogger(__name__)

TOPIC_PATTERN_SENSOR = "kafscale_topic_patterns_sensor"
WEBSERVER_URL_ENV_VAR = "KAFSCALE_LAKEHOUSE_WEBSERVER_URL"
TOPIC_PATTERN_SENSOR_INTERVAL_SECONDS = 30
RELOAD_RETRY_SECONDS = 120

# Reloads the code location named by its argument (None: unknown, e.g. a test's context); returns what it did.
Reload = Callable[[str | None], str]


def build_topic_pattern_sensor(config: LakehouseConfig, *, reload: Reload | None,
                               discover: Callable[[], TopicPatternResolution] | None = None,
                               clock: Callable[[], float] = time.time) -> dg.SensorDefinition:
    """The sensor of `config`'s topic patterns; `config` is the resolved config the definitions were built from (its
    mappings are the topics that have assets). `discover` resolves the patterns against the topics that exist now
    (default: discovery with the config's connections, built on the first tick)."""
    discover = discover or _discovery(config)
    patterns = ", ".join(f"mappings[{index}].topic_pattern {m.topic_pattern!r}" for index, m in config.pattern_mappings)

    @dg.sensor(name=TOPIC_PATTERN_SENSOR, minimum_interval_seconds=max(TOPIC_PATTERN_SENSOR_INTERVAL_SECONDS,
                                                                       config.processor.poll_interval_seconds),
               default_status=dg.DefaultSensorStatus.RUNNING,
               description=f"Onboards topics that appear while the deployment runs and match {patterns}: reloads "
                           "the code location so that their table assets, jobs and sensors exist.")
    def watch_topic_patterns(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        resolution = discover()  # against the loaded mappings: only topics without an asset are pattern topics
        for problem in resolution.problems:
            context.log.error(problem)
        problems = f" Not landed: {'; '.join(resolution.problems)}" if resolution.problems else ""
        waiting = resolution.pattern_topics
        if not waiting:
            context.update_cursor(None)
            return dg.SkipReason(f"every topic matching {patterns} has its table asset.{problems}")
        described = ", ".join(f"{topic!r} ({resolution.pattern_of[topic]})" for topic in waiting)
        requested = json.loads(context.cursor) if context.cursor else None
        now = clock()
        if requested is not None and requested["topics"] == waiting and now - requested["at"] < RELOAD_RETRY_SECONDS:
            return dg.SkipReason(f"new topics {described}: a reload of the code location was requested "
                                 f"{now - requested['at']:.0f} s ago; waiting for it.{problems}")
        if reload is None:
            context.log.warning("new topics %s have no table asset yet: reload the code location (UI: Deployment → "
                                "Reload) to onboard them, or set %s so that this sensor reloads it", described,
                                WEBSERVER_URL_ENV_VAR)
            return dg.SkipReason(f"new topics {described} wait for a reload of the code location (set "
                                 f"{WEBSERVER_URL_ENV_VAR} for this sensor to reload it).{problems}")
        origin = context.code_location_origin
        outcome = reload(origin.location_name if origin is not None else None)
        context.update_cursor(json.dumps({"topics": waiting, "at": now}))
        context.log.info("new topics %s: %s", described, outcome)
        return dg.SkipReason(f"new topics {described}: {outcome}.{problems}")

    return watch_topic_patterns


def _discovery(config: LakehouseConfig) -> Callable[[], TopicPatternResolution]:
    connections: list = []

    def discover() -> TopicPatternResolution:
        if not connections:
            etcd = etcd_client_from_config(config) if config.etcd.endpoints else None
            connections.append((segment_store_from_config(config), etcd))
        store, etcd = connections[0]
        return with_pattern_topics(config, store, etcd)

    return discover


def webserver_reload(url: str) -> Reload:
    """Reloads a code location through the Dagster webserver at `url` (`http://host:port`), in a background thread
    (the reload replaces the calling code server's process); failures are logged naming the url and location."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{WEBSERVER_URL_ENV_VAR} / webserver_url {url!r} is not an http(s)://host[:port] URL")

    def reload_location(location: str | None) -> str:
        if location is None:
            return f"cannot reload through {url}: this sensor does not know its code location's name"
        threading.Thread(target=_reload_through_graphql, args=(parsed, location), daemon=True,
                         name=f"reload {location}").start()
        return f"asked the webserver at {url} to reload code location {location!r}"

    return reload_location


def _reload_through_graphql(parsed, location: str) -> None:  # noqa: ANN001 - urllib's ParseResult
    from dagster_graphql import DagsterGraphQLClient, ReloadRepositoryLocationStatus

    where = f"{parsed.scheme}://{parsed.netloc}"
    try:
        client = DagsterGraphQLClient(parsed.hostname, port_number=parsed.port, use_https=parsed.scheme == "https",
                                      path_prefix=parsed.path.rstrip("/"), timeout=300)
        info = client.reload_repository_location(location)
    except Exception as exc:  # noqa: BLE001 - a background thread: report whatever stopped it
        log.error("reloading code location %r through the webserver at %s failed: %s", location, where, exc)
        return
    if info.status != ReloadRepositoryLocationStatus.SUCCESS:
        log.error("the webserver at %s did not reload code location %r: %s %s", where, location, info.failure_type,
                  info.message)
    else:
        log.info("the webserver at %s reloaded code location %r", where, location)
