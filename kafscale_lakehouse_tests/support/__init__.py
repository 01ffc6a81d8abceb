"""Test support shared by the test suite and `benchmarks/`: the real servers of shared/infra.md on free loopback
ports, and kafka-python's record-batch reader as a reference decoder (needs the `test` extra)."""
