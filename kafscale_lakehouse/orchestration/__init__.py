"""Dagster orchestration: thin definitions over `kafscale_lakehouse.engine` (names, resources, assets, IO manager,
checks, sensors, maintenance jobs)."""
