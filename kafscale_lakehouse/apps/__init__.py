"""Applications on top of the engine: the `kafscale-lakehouse` command line, `serve-metrics`, the per-table report,
and the demo producer with its pizza-order workload."""
