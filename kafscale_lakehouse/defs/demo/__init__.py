"""The demo lakehouse of our own code location (definitions.py)."""
