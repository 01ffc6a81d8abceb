"""Dagster definitions: the code location `dagster dev` loads (see [tool.dagster] in pyproject.toml)."""

import dagster as dg

defs = dg.Definitions()
