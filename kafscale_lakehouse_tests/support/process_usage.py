"""RSS and CPU time of this process and its descendants, sampled from /proc: what the benchmarks report as memory
and CPU per kind of process (driver, Spark JVM, Python workers)."""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_INTERVAL_SECONDS = 0.05
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcessUsage:
    peak_driver_rss: int = 0
    peak_tree_rss: int = 0
    start_driver_rss: int = 0
    cpu_seconds_by_kind: dict[str, float] = field(default_factory=dict)
    peak_tree_rss_by_kind: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind → (processes, bytes)

    @property
    def tree_cpu_seconds(self) -> float:
        return sum(self.cpu_seconds_by_kind.values())


class ProcessTreeSampler:
    """Samples RSS and CPU time of this process and all its descendants from /proc (except `excluded` subtrees).

    One read of /proc/<pid>/stat per process on the machine gives parent, RSS and CPU ticks, so a sample is cheap.
    CPU seconds count what each process used while sampled (a process that exits keeps its last reading).
    """

    def __init__(self, excluded: set[int], interval: float = SAMPLE_INTERVAL_SECONDS):
        self._excluded = excluded
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._first_cpu: dict[int, int] = {}
        self._last_cpu: dict[int, int] = {}
        self._kinds: dict[int, str] = {}
        self.usage = ProcessUsage()

    def __enter__(self) -> ProcessTreeSampler:
        self._sample(first=True)
        self.usage.start_driver_rss = self.usage.peak_driver_rss
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        by_kind: dict[str, float] = defaultdict(float)
        for pid, ticks in self._last_cpu.items():
            by_kind[self._kinds[pid]] += (ticks - self._first_cpu.get(pid, 0)) / _CLOCK_TICKS
        self.usage.cpu_seconds_by_kind = dict(by_kind)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def _sample(self, first: bool = False) -> None:
        stats = _all_process_stats()
        children: dict[int, list[int]] = defaultdict(list)
        for pid, (parent, _, _) in stats.items():
            children[parent].append(pid)
        driver = os.getpid()
        tree, pending = [], [driver]
        while pending:
            pid = pending.pop()
            if pid in self._excluded or pid not in stats:
                continue
            tree.append(pid)
            pending.extend(children.get(pid, ()))
        for pid in tree:
            if pid not in self._kinds:
                self._kinds[pid] = "driver" if pid == driver else _process_kind(pid)
            cpu = stats[pid][2]
            if first:
                self._first_cpu[pid] = cpu
            self._last_cpu[pid] = cpu
        usage = self.usage
        usage.peak_driver_rss = max(usage.peak_driver_rss, stats[driver][1])
        tree_rss = sum(stats[pid][1] for pid in tree)
        if tree_rss > usage.peak_tree_rss:
            usage.peak_tree_rss = tree_rss
            by_kind: dict[str, tuple[int, int]] = {}
            for pid in tree:
                processes, rss = by_kind.get(self._kinds[pid], (0, 0))
                by_kind[self._kinds[pid]] = (processes + 1, rss + stats[pid][1])
            usage.peak_tree_rss_by_kind = by_kind


def _all_process_stats() -> dict[int, tuple[int, int, int]]:
    """pid → (parent pid, RSS bytes, user+system CPU ticks) of every process visible in /proc."""
    stats = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat_file:
                raw = stat_file.read()
        except OSError:  # the process exited between listdir and open
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its closing parenthesis.
        fields = raw[raw.rindex(b")") + 2:].split()
        stats[int(name)] = (int(fields[1]), int(fields[21]) * _PAGE_SIZE, int(fields[11]) + int(fields[12]))
    return stats


def _process_kind(pid: int) -> str:
    """`Spark JVM`, `Python <worker module>` (PySpark daemons and the workers they fork) or the program name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline_file:
            argv = cmdline_file.read().decode(errors="replace").split("\0")
    except OSError:
        return "exited"
    if not argv[0]:
        return "exited"  # a zombie has no command line
    if Path(argv[0]).name == "java":
        return "Spark JVM"
    if "pyspark.daemon" in argv:
        modules = argv[argv.index("pyspark.daemon") + 1:]
        module = modules[0] if modules and modules[0] else "pyspark.worker"
        return f"Python {module.removeprefix('pyspark.sql.worker.').removeprefix('pyspark.')}"
    return Path(argv[0]).name
