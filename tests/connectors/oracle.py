"""What the generator pipelines must output, computed from the generator's documented
definition (``tests/connectors/generator.py``'s docstring, not its code), and the helpers
the external-connector tests share: a database of a test's own, ``sluice`` subprocesses,
the exactly-once check."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from enumerator_service import connect_engine, upgrade_schema
from enumerator_service._schema import dead_letters, enumerator_state, splits

__all__ = [
    "COLUMNS",
    "FIRST_DAY",
    "MODULE",
    "REPO",
    "Oracle",
    "assert_exactly_once",
    "cli_env",
    "cursor_of",
    "ok",
    "oracle",
    "output_rows",
    "own_database",
    "sluice",
    "split_progress",
    "start_run",
]

REPO = Path(__file__).resolve().parents[2]
SLUICE = Path(sys.executable).with_name("sluice")
#: The pipeline module (``SLUICE_PIPELINES``).
MODULE = "tests.connectors.generator_pipeline"
FIRST_DAY = date(2026, 5, 1)
COLUMNS = ["event_id", "user_id", "event_type", "amount", "event_time", "amount_cents", "dt"]


# --------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Oracle:
    #: Output rows (COLUMNS order) by event id.
    rows: dict[str, tuple[Any, ...]]
    #: Sequence numbers of the records that are dead letters.
    dead_letters: set[int]
    #: Records the Filter removes (views).
    removed: int


def oracle(*, per_day: int, days: list[int], seed: int = 7) -> Oracle:
    """The output of ``days`` (indices from FIRST_DAY): record n is of day n // per_day;
    every 101st has no user (a required field: a dead letter); the pipeline keeps the
    events that are not views and adds the amount in cents."""
    rows: dict[str, tuple[Any, ...]] = {}
    dead: set[int] = set()
    removed = 0
    step = 86_400_000_000 // per_day
    for day in days:
        midnight = datetime(FIRST_DAY.year, FIRST_DAY.month, FIRST_DAY.day, tzinfo=UTC)
        midnight += timedelta(days=day)
        for n in range(day * per_day, (day + 1) * per_day):
            if n % 101 == 100:
                dead.add(n)
                continue
            kind = ("view", "click", "purchase")[n % 3]
            if kind == "view":
                removed += 1
                continue
            offset = (n % per_day) * step + (n * 7919 + seed) % step
            event_id = f"g{seed}-{n:07d}"
            rows[event_id] = (
                event_id,
                (n * 31 + seed) % 97,
                kind,
                ((n * 7 + seed) % 20_000) / 100 - 50,
                midnight + timedelta(microseconds=offset),
                (n * 7 + seed) % 20_000 - 5_000,  # the Map's round(amount * 100)
                (FIRST_DAY + timedelta(days=day)).isoformat(),
            )
    return Oracle(rows, dead, removed)


def output_rows(folder: Path) -> list[tuple[Any, ...]]:
    """Every row of a pipeline's Parquet output (all ``dt=`` folders), in COLUMNS order."""
    if not folder.exists():
        return []
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table()
    return [tuple(str(r[c]) if c == "dt" else r[c] for c in COLUMNS) for r in table.to_pylist()]


def _dead_letter_offsets(db_url: str, source: str) -> list[int]:
    engine = connect_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.select(dead_letters.c.offset).where(dead_letters.c.source == source)
            )
            return [int(n) for n in found.scalars()]
    finally:
        engine.dispose()


def assert_exactly_once(expected: Oracle, folder: Path, db_url: str, source: str) -> str:
    """Output == oracle (each row once, with its values: duplicates = 0, missing = 0, no
    other row) and the dead letters are the oracle's, each once; a one-line result."""
    rows = output_rows(folder)
    keys = [row[0] for row in rows]
    duplicates = len(keys) - len(set(keys))
    missing = expected.rows.keys() - set(keys)
    extra = set(keys) - expected.rows.keys()
    assert (duplicates, len(missing), len(extra)) == (0, 0, 0), (
        f"duplicates={duplicates} missing={len(missing)} (e.g. {sorted(missing)[:3]}) "
        f"extra={len(extra)} (e.g. {sorted(extra)[:3]})"
    )
    different = [row for row in rows if expected.rows[row[0]] != row]
    assert not different, f"{len(different)} rows differ: {different[0]} != " + str(
        expected.rows[different[0][0]]
    )
    dead = _dead_letter_offsets(db_url, source)
    assert len(dead) == len(set(dead)), "a dead letter was written twice"
    assert set(dead) == expected.dead_letters
    return (
        f"rows={len(rows)} duplicates={duplicates} missing={len(missing)} "
        f"unexpected={len(extra)} dead_letters={len(dead)}"
    )


def split_progress(db_url: str, source: str) -> list[tuple[int, int, int | None, str]]:
    """(start, end, committed offset, status) of every split of ``source``."""
    engine = connect_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            c = splits.c
            found = conn.execute(
                sa.select(c.start_offset, c.end_offset, c.committed_offset, c.status)
                .where(c.source == source)
                .order_by(c.start_offset)
            )
            return [(int(a), int(b), c, str(s)) for a, b, c, s in found.all()]
    finally:
        engine.dispose()


def cursor_of(db_url: str, source: str) -> dict[str, Any] | None:
    """The discovery cursor the enumerator persisted for ``source``."""
    engine = connect_engine(db_url, pool_size=1)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.select(enumerator_state.c.cursor).where(enumerator_state.c.source == source)
            ).scalar()
            return None if found is None else dict(found)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- the platform


@contextlib.contextmanager
def own_database(server_url: str) -> Iterator[str]:
    """A database of the caller's own on the test server, migrated to head; dropped after."""
    name = f"sluice_extconn_{secrets.token_hex(4)}"
    admin = sa.create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        engine = connect_engine(url, pool_size=1)
        try:
            upgrade_schema(engine)
        finally:
            engine.dispose()
        yield url
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def cli_env(db_url: str, root: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``sluice`` subprocess (never the caller's ``SLUICE_*``): the
    repository on ``PYTHONPATH`` — the driver imports the pipeline module, the Spark workers
    the connector module."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    tmp = root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        SLUICE_DATABASE_URL=db_url,
        SLUICE_HOME=str(root / "home"),
        SLUICE_DATA_DIR=str(root / "data"),
        SLUICE_PIPELINES=MODULE,
        SLUICE_SPARK_MASTER="local[2]",
        SLUICE_PARALLELISM="2",
        SLUICE_CHECKPOINT_INTERVAL_SECONDS="1",
        SLUICE_FILE_SETTLE_SECONDS="0",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        # Killed JVMs leave block managers and temp files behind: keep them in the test's.
        SPARK_LOCAL_DIRS=str(tmp),
        TMPDIR=str(tmp),
        COLUMNS="200",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def sluice(env: dict[str, str], root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``sluice ARGS`` in ``root``; its duration is printed (``-s`` shows it)."""
    started = time.monotonic()
    try:
        return subprocess.run(
            [str(SLUICE), *args],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        print(f"sluice {' '.join(args)}: {time.monotonic() - started:.1f} s")


def start_run(env: dict[str, str], root: Path, pipeline: str, log: Path) -> subprocess.Popen[str]:
    """``sluice run PIPELINE`` in a session of its own (driver and JVM lead its process
    group), output to ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            [str(SLUICE), "run", pipeline],
            env=env,
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
