"""Where the database server's CPU goes during a run: each backend's CPU, sampled every 50 ms,
is charged to what the backend is running (or last ran) at that moment.

The categories are the statements a Sluice run sends: batched lookups, the table sink's
staging COPY and its commit (the move of staged rows into the target), the platform's own
bookkeeping (splits, checkpoints, dead letters) and background processes (autovacuum, WAL
writer, checkpointer). A backend that exits between two samples loses its last 50 ms, so the
sum is a little under ``postgres_cpu_seconds``' total.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

__all__ = ["StatementCpu", "breakdown", "statement_kind"]

_TICK = os.sysconf("SC_CLK_TCK")
_ACTIVITY = (
    "SELECT pid, backend_type, query FROM pg_stat_activity"
    " WHERE pid <> pg_backend_pid() AND datname IS NOT DISTINCT FROM current_database()"
    " OR backend_type <> 'client backend'"
)


def statement_kind(backend_type: str, query: str | None) -> str:
    """The category of a backend's CPU: what its current or last statement is."""
    if backend_type != "client backend":
        return "background"
    text = (query or "").lstrip()
    if "array_agg(" in text:
        return "lookups"
    if text.startswith("COPY"):
        return "sink staging"
    if text.startswith("WITH moved AS (DELETE") or " SELECT DISTINCT ON " in text:
        return "sink commit"  # Sluice's move, or the orders ceiling's one upsert
    if "sluice." in text or 'sluice".' in text:
        return "platform"
    return "other"


def _ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime


class StatementCpu(threading.Thread):
    """Samples ``engine``'s server (on this machine) until stopped; ``seconds`` maps each
    category of :func:`statement_kind` to the CPU seconds charged to it."""

    def __init__(self, engine: Any, interval: float = 0.05) -> None:
        super().__init__(name="postgres-cpu-by-statement", daemon=True)
        self._engine = engine
        self._interval = interval
        self._stop_event = threading.Event()
        self._last: dict[int, int] = {}
        self._charged: Counter[str] = Counter()

    def stop(self) -> dict[str, float]:
        self._stop_event.set()
        self.join()
        return self.seconds

    @property
    def seconds(self) -> dict[str, float]:
        return {kind: ticks / _TICK for kind, ticks in self._charged.most_common()}

    def run(self) -> None:
        import sqlalchemy as sa

        with self._engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            while True:
                for pid, backend_type, query in conn.execute(sa.text(_ACTIVITY)).all():
                    ticks = _ticks(pid)
                    if ticks is None:
                        continue
                    before = self._last.get(pid)
                    self._last[pid] = ticks
                    if before is not None and ticks > before:
                        self._charged[statement_kind(backend_type, query)] += ticks - before
                if self._stop_event.wait(self._interval):
                    return


def breakdown(seconds: dict[str, float]) -> str:
    """``PG CPU s: lookups 3.1, sink commit 4.4, …`` (categories over 0.05 s), or ''."""
    parts = [f"{kind} {value:.1f}" for kind, value in seconds.items() if value >= 0.05]
    return f"PG CPU s: {', '.join(parts)}" if parts else ""
