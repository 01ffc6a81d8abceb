"""Land KafScale topics in Apache Iceberg tables."""
