"""Dagster definitions: the code location `dagster dev` loads (see [tool.dagster] in pyproject.toml).

The defs folder `kafscale_lakehouse/defs` holds one `KafscaleLakehouseComponent` (the one way definitions are built,
here and in a user's dg project) on the lakehouse config (`$KAFSCALE_LAKEHOUSE_CONFIG`, default `lakehouse.yaml`):
per mapping the topic's observable asset, the table asset with its checks, an ingest job and a sensor. A config that
cannot be used (unknown key, wrong type, invalid table name) fails here, when the code location loads, with a
`ConfigError` naming the key. Loading contacts no server (S3, etcd, the catalog, the registry), except to list the
topics when the config has `topic_pattern` mappings (one discovery request; when it fails, the explicit mappings
load): a topic that does not exist yet or a server that is down is reported by the topic's sensor and by the run,
naming it, and never takes the other mappings' sensors down. Beside it, `defs/demo` adds the demo lakehouse's
downstream assets and automation (`demo_assets.py`); only this code location has them.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from dagster.components import load_defs

import kafscale_lakehouse.defs
from kafscale_lakehouse.config import ConfigError
from kafscale_lakehouse.orchestration.component import build_definitions

__all__ = ["build_definitions", "defs"]


@dg.definitions
def defs() -> dg.Definitions:
    # Not load_from_defs_folder: that needs pyproject.toml's [tool.dg], which an installed package (the image) lacks.
    try:
        return load_defs(kafscale_lakehouse.defs, project_root=Path(kafscale_lakehouse.defs.__file__).parents[2])
    except Exception as err:
        # The component tree wraps what the component raised; a config fault is reported as itself (key and file).
        if isinstance(err.__cause__, ConfigError):
            raise err.__cause__ from None
        raise
