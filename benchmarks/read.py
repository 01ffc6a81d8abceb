"""Aggregate a landed-shape table through `load_input`'s path and through the old one, with a 1 GB driver.

    .venv/bin/python benchmarks/read.py --rows 20000000

Builds (once, in --dir) a sqlite-catalog table of `--rows` pizza orders written by `engine.spark.writes` on the
executors, then runs, each in a fresh process with `spark.driver.memory=1g`:
- `executors`: `engine.spark.table_source.read_table` (the IO manager's `load_input`), aggregate orders per store
  and sauce;
- `driver`: the old `load_input`, `table.scan().to_arrow()` then `spark.createDataFrame`, same aggregate.
Prints rows/s and the peak RSS of the driver: its Python process (VmHWM) and its JVM (VmHWM, sampled; in local mode
that JVM also runs the executor threads).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("benchmarks.read")
TABLE = "bench.orders"


def _catalog(directory: Path):
    from kafscale_lakehouse.engine.tables.catalogs import CatalogSettings, load_catalog

    return load_catalog(CatalogSettings(type="sql", warehouse=str(directory / "warehouse")))


def _spark(memory: str):
    from kafscale_lakehouse.engine.spark.session import get_spark_session

    return get_spark_session("local[2]", {"spark.driver.memory": memory, "spark.sql.shuffle.partitions": "4"},
                             ui_enabled=False)


def build(directory: Path, rows: int) -> None:
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's conventional alias

    from kafscale_lakehouse.engine.spark.writes import write_dataframe
    from kafscale_lakehouse.engine.tables.writes import TableWrite

    catalog = _catalog(directory)
    if catalog.table_exists(TABLE) and catalog.load_table(TABLE).scan().count() == rows:
        return
    if catalog.table_exists(TABLE):
        catalog.drop_table(TABLE)
    spark = _spark("2g")
    df = spark.range(0, rows, numPartitions=max(2, rows // 2_000_000)).select(
        F.concat(F.lit("completed-pizzas:0:"), F.col("id").cast("string")).alias("record_id"),
        (F.col("id") % 4).cast("int").alias("partition"), F.col("id").alias("offset"),
        F.expr("uuid()").alias("order_id"), (F.col("id") % 50).cast("int").alias("store_id"),
        F.element_at(F.array(*[F.lit(s) for s in ("tomato", "pesto", "bbq", "white")]),
                     (F.col("id") % 4 + 1).cast("int")).alias("sauce"),
        F.expr("timestamp_seconds(1795000000 + id % 864000)").alias("date_ordered"))
    start = time.monotonic()
    write_dataframe(catalog, df, TableWrite(TABLE, run_id="bench-build", mode="overwrite"))
    log.info("built %s with %d rows in %.1f s", TABLE, rows, time.monotonic() - start)
    spark.stop()


def _vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def measure(directory: Path, path: str) -> dict:
    """One path in this process; returns its figures."""
    spark = _spark("1g")
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    jvm_peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            jvm_peak[0] = max(jvm_peak[0], _vm_hwm_kb(jvm_pid))
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    table = _catalog(directory).load_table(TABLE)
    rows = int(table.current_snapshot().summary["total-records"])
    start = time.monotonic()
    error = None
    try:
        if path == "executors":
            from kafscale_lakehouse.engine.spark.table_source import read_table

            df = read_table(spark, table, columns=["store_id", "sauce"])
        else:
            df = spark.createDataFrame(table.scan().to_arrow())
        groups = df.groupBy("store_id", "sauce").count().collect()
        assert sum(g["count"] for g in groups) == rows
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    seconds = time.monotonic() - start
    done.set()
    jvm_peak[0] = max(jvm_peak[0], _vm_hwm_kb(jvm_pid))
    return {"path": path, "rows": rows, "seconds": round(seconds, 2),
            "rows_per_second": None if error else round(rows / seconds),
            "driver_python_peak_rss_mb": round(_vm_hwm_kb(os.getpid()) / 1024),
            "driver_jvm_peak_rss_mb": round(jvm_peak[0] / 1024), "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--dir", type=Path, default=Path("var/bench-read"))
    parser.add_argument("--path", choices=["executors", "driver"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.path:
        print(json.dumps(measure(args.dir, args.path)))
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    build(args.dir, args.rows)
    for path in ("executors", "driver"):
        done = subprocess.run([sys.executable, __file__, "--dir", str(args.dir), "--path", path],
                              capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        figures = json.loads(lines[-1]) if lines else {"path": path, "error": f"process exited {done.returncode}: "
                                                       f"{done.stderr.strip().splitlines()[-1:]}"}
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
