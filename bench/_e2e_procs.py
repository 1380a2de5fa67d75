"""``bench/e2e.py``: CPU time and peak memory of this process and its descendants."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _e2e_pgcpu import StatementCpu  # bench/ is on sys.path when run as a script

# -- processes: CPU time and peak memory of this process and its descendants --------------


def _read_small(path: str) -> bytes:
    """A /proc file's bytes (raw ``os`` calls: the sampler reads one per process twice a
    second while the measured run shares the cores, so it keeps its own cost low)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _process_table() -> dict[int, tuple[int, str, int]]:
    """pid → (ppid, comm, utime+stime+cutime+cstime ticks) of every process."""
    table: dict[int, tuple[int, str, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = _read_small(f"/proc/{name}/stat")
        except OSError:
            continue  # exited meanwhile
        close = stat.rindex(b")")
        comm = stat[stat.index(b"(") + 1 : close].decode(errors="replace")
        fields = stat[close + 2 :].split()
        table[int(name)] = (int(fields[1]), comm, sum(int(f) for f in fields[11:15]))
    return table


def _descendants(table: dict[int, tuple[int, str, int]]) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _comm, _ticks) in table.items():
        children[ppid].append(pid)
    found, todo = [], list(children[os.getpid()])
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children[pid])
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _kind(pid: int, comm: str) -> str | None:
    if comm == "java":
        return "jvm"
    command = _cmdline(pid)
    if "-m spark_jobs._daemon" in command or "pyspark.worker" in command:
        return "worker"
    if "multiprocessing.spawn" in command:
        return "worker"  # a ceiling job's process (bench/_e2e_ceiling.py)
    return None


def _memory_kib(pid: int) -> tuple[int, int]:
    """(VmHWM, VmRSS) of ``pid`` in KiB; zeros when it exited."""
    try:
        status = _read_small(f"/proc/{pid}/status").decode(errors="replace")
    except OSError:
        return 0, 0
    values = dict(re.findall(r"^(VmHWM|VmRSS):\s+(\d+) kB", status, re.MULTILINE))
    return int(values.get("VmHWM", 0)), int(values.get("VmRSS", 0))


def _own_seconds() -> float:
    """CPU time of this process (its threads; not its children)."""
    own = os.times()
    return own.user + own.system


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores; idle and I/O wait
    excluded): the other tenants' share of a run is this minus the run's own and Postgres'."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> float:
    """CPU time of this process, its waited-for children and all live descendants (the Spark
    JVM, the Python daemon and its workers). Postgres is not included."""
    table = _process_table()
    ticks = sum(table[pid][2] for pid in _descendants(table) if pid in table)
    own = os.times()
    own_seconds = own.user + own.system + own.children_user + own.children_system
    return own_seconds + ticks / os.sysconf("SC_CLK_TCK")


#: The postmaster of the benchmark's database when it runs on this machine, and an engine of
#: that database (``watch_postgres``).
_POSTMASTER: list[int] = []
_ENGINE: list[Any] = []


def backend_pid(engine: Any) -> int:
    """The server process of one of ``engine``'s connections."""
    import sqlalchemy as sa

    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def watch_postgres(engine: Any, *, by_statement: bool = False) -> bool:
    """Measure the CPU of ``engine``'s database server from now on (in total, and by
    statement when ``by_statement``: ``_e2e_pgcpu``, whose 20 Hz sampling costs this process
    and the server CPU of their own, so it is off unless asked for); the parent of one of its
    backends is the postmaster. False when that process is not on this machine (a remote
    ``SLUICE_DATABASE_URL``)."""
    backend = backend_pid(engine)
    table = _process_table()
    if backend not in table or table[table[backend][0]][1] != "postgres":
        return False
    _POSTMASTER[:] = [table[backend][0]]
    _ENGINE[:] = [engine] if by_statement else []
    return True


def postgres_cpu_seconds() -> float | None:
    """CPU time of the watched Postgres: the postmaster's own and its reaped children's (every
    backend that exited) plus its live children's (backends, WAL writer, checkpointer)."""
    if not _POSTMASTER:
        return None
    (postmaster,) = _POSTMASTER
    table = _process_table()
    if postmaster not in table:
        return None
    ticks = table[postmaster][2] + sum(
        t for pid, (ppid, _c, t) in table.items() if ppid == postmaster and pid != postmaster
    )
    return ticks / os.sysconf("SC_CLK_TCK")


class MemorySampler(threading.Thread):
    """Peak RSS of the Python workers and of the driver (JVM + this process) while running.

    On entry the high-water marks of this process and its descendants are reset (``5`` to
    ``/proc/<pid>/clear_refs``); the thread then reads ``VmHWM`` every ``interval`` seconds,
    so a peak between two samples is still seen, and a worker that exits early is too (each
    sample reads ``/proc`` for every process: a cost the measured run shares its cores with,
    hence 0.5 s, not finer).
    ``trace`` holds (seconds since entry, the largest worker's current RSS in KiB).
    ``postgres_cpu``: CPU seconds of the watched Postgres between entry and exit (None when
    none is watched); ``postgres_cpu_by``: the same by kind of statement (``_e2e_pgcpu``).
    ``cpu_by``: CPU seconds between entry and exit by process kind (``driver``: this Python
    process; ``jvm``; ``worker``: the Python daemon and its workers, exited ones included
    through their parent's reaped-children time), to see where a run's CPU goes; ``others``:
    the rest of the machine's busy CPU meanwhile (other tenants: the load a run competes with).
    """

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(name="memory-sampler", daemon=True)
        self._interval = interval
        self._stop_event = threading.Event()
        self._peaks: dict[int, tuple[str, int]] = {}
        self._began = time.perf_counter()
        self.trace: list[tuple[float, int]] = []
        self.postgres_cpu: float | None = None
        self.postgres_cpu_by: dict[str, float] = {}
        self._postgres_began: float | None = None
        self._statements = StatementCpu(_ENGINE[0]) if _ENGINE else None
        self._ticks_began: dict[int, int] = {}
        self._driver_began = 0.0
        self._machine_began = 0.0
        self.cpu_by: dict[str, float] = {}
        # A process's kind, by pid (its command line is read once, not at every sample).
        self._kinds: dict[int, str | None] = {}

    def __enter__(self) -> MemorySampler:
        table = _process_table()
        for pid in [os.getpid(), *_descendants(table)]:
            # OSError: exited, or a kernel without it (peaks then include earlier variants).
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        self._began = time.perf_counter()
        self._ticks_began = {pid: ticks for pid, (_p, _c, ticks) in _process_table().items()}
        self._driver_began = _own_seconds()
        self._machine_began = machine_busy_seconds()
        self._postgres_began = postgres_cpu_seconds()
        if self._statements is not None:
            self._statements.start()
        self._sample()
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop_event.set()
        self.join()
        self._sample()
        self._charge_cpu()
        busy = machine_busy_seconds() - self._machine_began
        if self._postgres_began is not None:
            # Backends whose clients just disconnected are still exiting: one that exits while
            # /proc is read is neither a live child nor reaped yet, and its CPU would be lost.
            time.sleep(0.3)
        ended = postgres_cpu_seconds()
        if ended is not None and self._postgres_began is not None:
            self.postgres_cpu = ended - self._postgres_began
        if self._statements is not None:
            self.postgres_cpu_by = self._statements.stop()
        others = busy - sum(self.cpu_by.values()) - (self.postgres_cpu or 0.0)
        self.cpu_by["others"] = max(0.0, others)

    def _charge_cpu(self) -> None:
        # A worker reaped meanwhile is in its parent's cutime (the daemon's): as cpu_seconds.
        table = _process_table()
        charged: dict[str, float] = defaultdict(float)
        tick = os.sysconf("SC_CLK_TCK")
        for pid in _descendants(table):
            _ppid, comm, ticks = table[pid]
            kind = _kind(pid, comm) or comm
            charged[kind] += (ticks - self._ticks_began.get(pid, 0)) / tick
        charged["driver"] = _own_seconds() - self._driver_began
        self.cpu_by = dict(charged)

    def _sample(self) -> None:
        table = _process_table()
        pids = [(os.getpid(), "driver")]
        for pid in _descendants(table):
            if pid not in self._kinds:
                self._kinds[pid] = _kind(pid, table[pid][1]) if pid in table else None
            kind = self._kinds[pid]
            if kind is not None:
                pids.append((pid, kind))
        worker_rss = 0
        for pid, kind in pids:
            hwm, rss = _memory_kib(pid)
            if hwm > self._peaks.get(pid, (kind, 0))[1]:
                self._peaks[pid] = (kind, hwm)
            if kind == "worker":
                worker_rss = max(worker_rss, rss)
        self.trace.append((time.perf_counter() - self._began, worker_rss))

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            self._sample()

    @property
    def worker_mib(self) -> float | None:
        peaks = [kib for kind, kib in self._peaks.values() if kind == "worker"]
        return max(peaks) / 1024 if peaks else None

    @property
    def driver_mib(self) -> float:
        return sum(kib for kind, kib in self._peaks.values() if kind in ("jvm", "driver")) / 1024

    def worker_profile(self, points: int = 5) -> list[float]:
        """The largest worker's RSS (MiB) at ``points`` evenly spaced moments of the run."""
        if not self.trace:
            return []
        end = self.trace[-1][0]
        picks = []
        for i in range(points):
            at = end * i / (points - 1)
            picks.append(min(self.trace, key=lambda sample: abs(sample[0] - at))[1] / 1024)
        return picks


def timed_run(fn: Callable[[], Any]) -> tuple[float, float, MemorySampler, Any]:
    """(wall seconds, CPU seconds, memory peaks, result) of ``fn()``."""
    cpu = cpu_seconds()
    with MemorySampler() as memory:
        start = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - start
    return wall, cpu_seconds() - cpu, memory, result
