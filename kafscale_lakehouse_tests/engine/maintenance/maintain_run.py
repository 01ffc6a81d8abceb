"""`maintenance.maintain_table` on the first mapping's table, in a process of its own (test_maintenance_kills.py
SIGKILLs it at random points).

    python -m kafscale_lakehouse_tests.engine.maintenance.maintain_run --config lakehouse.yaml \
        --orphan-min-age-seconds 60

Test-only: every step runs on every call (snapshots of any age expired down to the newest 3, partitions with two
small files compacted, manifests merged from two on), and orphan files need only `--orphan-min-age-seconds` (the
config's minimum is a day), so that files of killed runs become orphans within the test.
"""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta

from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.connections import catalog_settings
from kafscale_lakehouse.engine.maintenance import MaintenanceSettings, maintain_table
from kafscale_lakehouse.engine.spark.session import get_spark_session
from kafscale_lakehouse.engine.tables.catalogs import load_catalog, open_table

EVERY_STEP_EVERY_TIME = {"snapshot_max_age": timedelta(0), "retain_last": 3,
                         "target_file_size_bytes": 64 * 1024 * 1024, "min_input_files": 2, "manifest_min_count": 2}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--orphan-min-age-seconds", type=float, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args.config)
    spark = get_spark_session(config.spark.master, dict(config.spark.conf))
    table = open_table(load_catalog(catalog_settings(config)), config.mappings[0].table)
    settings = MaintenanceSettings(orphan_min_age=timedelta(seconds=args.orphan_min_age_seconds),
                                   **EVERY_STEP_EVERY_TIME)
    maintain_table(spark, table, settings)


if __name__ == "__main__":
    main()
