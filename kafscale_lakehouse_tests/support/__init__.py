"""Test support shared by the test suite, `benchmarks/` and `make demo`: the real servers of shared/infra.md on free
loopback ports, the in-memory Confluent-compatible schema registry, kafka-python's record-batch reader as a reference
decoder (needs the `test` extra), and the benchmarks' harness. Not in the wheel: it runs from the repository."""
