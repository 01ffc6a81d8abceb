"""The demo lakehouse's downstream assets (`rpc/pizzas_clean`, `rpc/sauce_daily`), their checks and their automation
sensor: part of our own code location only (the demo, `make demo`), never of a project that uses the component, even
one that lands a table `rpc.pizzas`. They read the landed `rpc/pizzas` through the resources the lakehouse component
defines beside them, so they are added when the location's config (`$KAFSCALE_LAKEHOUSE_CONFIG`, default
`lakehouse.yaml`) maps that table."""

import dagster as dg

from kafscale_lakehouse.config import load_config
from kafscale_lakehouse.demo_assets import DEMO_LANDED_TABLE, demo_definitions


@dg.definitions
def defs() -> dg.Definitions:
    if any(mapping.table == DEMO_LANDED_TABLE for mapping in load_config().mappings):
        return demo_definitions()
    return dg.Definitions()
