"""The dg defs folder of our own code location (`[tool.dg.project]` in pyproject.toml): one
`KafscaleLakehouseComponent` (lakehouse/defs.yaml) on the lakehouse config of `$KAFSCALE_LAKEHOUSE_CONFIG`."""
