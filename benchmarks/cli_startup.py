"""What the CLI's start-up and exit tricks save a process that loads what `ingest --once` imports.

Run from the repository root: `.venv/bin/python benchmarks/cli_startup.py [--repeat 5]`.

`kafscale-lakehouse` (apps/cli.py `main`, as its own process) pauses garbage collection while it starts and freezes
what starting made (`startup_without_collections`), freezes the collector at exit (`atexit.register(gc.freeze)`) and
leaves through `os._exit` once the exit functions ran (`EndWithoutTeardown`). Each variant below is a fresh
interpreter that imports what `ingest --once` imports (the CLI, the config, the ingestion run, the Spark engine client)
with those tricks on or off, then exits; the variants run in turn, `--repeat` times each, and the median CPU
seconds (user + system, from the kernel's accounting of the finished child) and wall seconds of each are printed
with their ratio to the variant without tricks.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = ("none", "startup", "freeze", "exit", "startup,freeze,exit")
# The child: the tricks named in argv[1], as apps/cli.py applies them, around the imports of `ingest --once`.
CHILD = """
import atexit, gc, sys
from kafscale_lakehouse.apps.cli import EndWithoutTeardown, startup_without_collections
tricks = set(sys.argv[1].split(",")) - {"none"}
end = EndWithoutTeardown()
if "exit" in tricks:
    atexit.register(end)
with startup_without_collections("startup" in tricks):
    import pyspark.sql.connect.session, kafscale_lakehouse.config, kafscale_lakehouse.engine.ingestion
    import kafscale_lakehouse.engine.spark
if "freeze" in tricks:
    atexit.register(gc.freeze)
end.status = 0
"""


def run_child(variant: str) -> tuple[float, float]:
    """CPU and wall seconds of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, variant], check=True, env={**os.environ})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each variant (default 5)")
    args = parser.parse_args()
    run_child("none")  # bytecode caches written, files in the page cache: not counted
    figures: dict[str, list[tuple[float, float]]] = {variant: [] for variant in VARIANTS}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            figures[variant].append(run_child(variant))
    base_cpu = statistics.median(cpu for cpu, _ in figures["none"])
    base_wall = statistics.median(wall for _, wall in figures["none"])
    print(f"{args.repeat} runs each, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(f"{'tricks':<22} {'CPU s':>7} {'wall s':>7} {'CPU/none':>9} {'wall/none':>10}")
    for variant, runs in figures.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"{variant:<22} {cpu:7.2f} {wall:7.2f} {cpu / base_cpu:9.2f} {wall / base_wall:10.2f}")


if __name__ == "__main__":
    main()
