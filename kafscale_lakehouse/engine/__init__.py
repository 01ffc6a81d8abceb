"""PySpark engine: Spark session, Iceberg catalogs, the Iceberg append sink and the table-offsets commit protocol."""
