"""Errors, not kills: a sink that cannot write must fail its run, never commit past the rows
it lost (issue 21, row 3 and the sink half of "errors can never be committed past").

- The warehouse disk fills while ``clickstream`` (JSON Lines → lookup → Parquet) runs: its
  warehouse is a tmpfs of its own, filled up to 256 KiB before the run, so the run's own
  output fills it mid-run (ENOSPC from a write, or a close that "succeeds" without a footer).
  The run must exit non-zero with no output published from the failed writes; after the
  space is freed, runs drain the rest. The published Parquet files must each be readable
  and hold every landed event exactly once.
- The Postgres sink's tables refuse writes for a while (``orders``: CSV → lookups →
  upsert into ``analytics.orders_enriched``): a trigger on the staging table, or on the
  target table, raises while a flag row exists. The run must exit non-zero; after the flag
  is removed, runs drain the rest: every order committed exactly once, none left staged.

Runs go through the ``sluice`` CLI in subprocesses against a Postgres server of the test's
own (``fault_harness``). Mounting a tmpfs needs root (or CAP_SYS_ADMIN); without it the disk
case is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from fault_harness import (
    Chaos,
    Driver,
    OwnPostgres,
    Run,
    expected_events,
    log,
    run_summary,
    sluice,
    sluice_env,
    verify,
)
from kill_cases import LEASE_SECONDS, own_postgres, run_settings
from orders_oracle import landed_orders, verify_orders
from sink_harness import refuse_batch_tables

from enumerator_service._database import asyncpg_dsn
from examples._clickstream_data import DemoSpec, generate_events, load_users

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(300)]

EVENTS = 80_000
USERS = 10_000
#: The warehouse tmpfs: room for the whole output (~3 MiB) once the filler is gone.
TMPFS = "48m"
#: Free bytes in the warehouse during the failing run: a part of the output.
LEFT = 256 << 10


@pytest.fixture(scope="module")
def postgres(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path]]:
    with own_postgres(request) as server_and_root:
        yield server_and_root


def _settings(work: Path, db_url: str, modules: str) -> dict[str, str]:
    return {**run_settings(work, db_url, modules), "SLUICE_LOOKUP_TIMEOUT_SECONDS": "20"}


def _finish(run: Run) -> int:
    rc = run.wait(180)
    if rc is None:
        run.terminate_all()
        raise AssertionError(f"run {run.number} did not end; log tail:\n{run.output()[-3000:]}")
    log(f"run {run.number} ended: exit {rc}; {run_summary(run.output())}")
    return rc


def _drain(server: OwnPostgres, work: Path, env: dict[str, str], db_url: str, name: str) -> None:
    """Fault-free runs until one has nothing new and every split is committed."""
    # The failed run's splits come back when its leases expire.
    time.sleep(LEASE_SECONDS + 1)
    driver = Driver(Chaos(0, []), env, work, server, db_url, name, LEASE_SECONDS)
    driver._number = 1  # run logs go on from the failed run's
    try:
        driver.drain()
    finally:
        driver.close()


# -- the warehouse disk fills ----------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(folder: Path, size: str) -> Iterator[Path]:
    folder.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the warehouse: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def _fill(folder: Path, leave: int) -> Path:
    """Fill the file system of ``folder`` up to ``leave`` free bytes; returns the filler."""
    filler = folder / "filler.bin"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as out:
        for size in (1 << 20, 4096):
            while True:
                try:
                    out.write(chunk[:size])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        out.truncate(max(0, out.tell() - leave))  # tmpfs gives truncated pages back
    return filler


def _published(output: Path) -> tuple[Counter[str], list[str]]:
    """Event ids (with their counts) of every published file, and the files nobody can read."""
    counts: Counter[str] = Counter()
    unreadable: list[str] = []
    for path in sorted(output.rglob("*.parquet")) if output.is_dir() else []:
        try:
            counts.update(pq.read_table(path, columns=["event_id"]).column(0).to_pylist())
        except (OSError, ValueError) as exc:  # pyarrow: ArrowInvalid is a ValueError
            unreadable.append(f"{path.name}: {exc}")
    return counts, unreadable


# `extended` (CI's 30-minute budget: `make faults` runs it, `make test` leaves it out).
@pytest.mark.extended
def test_a_full_warehouse_fails_the_run_and_loses_nothing(
    postgres: tuple[OwnPostgres, Path],
) -> None:
    server, root = postgres
    work = root / "disk_full"
    work.mkdir()
    db_url = server.create_database("errors_disk_full")
    env = sluice_env(_settings(work, db_url, "examples.clickstream"), work)
    landing = work / "data" / "landing" / "events"
    with _tmpfs(work / "data" / "warehouse", TMPFS) as warehouse:
        output = warehouse / "enriched_events"
        sluice(env, work, "db", "upgrade")
        users = asyncpg_dsn(db_url)
        load_users(users, schema="public", table="users", key="id", users=USERS, seed=7)
        spec = DemoSpec(EVENTS, 3, 4, USERS, date(2026, 1, 1), seed=21)
        generate_events(landing, spec)
        sluice(env, work, "discover", "clickstream")
        expected = expected_events(landing)

        # Room for a part of the output only: the run's own writes fill the disk mid-run,
        # however fast the machine is.
        filler = _fill(warehouse, LEFT)
        log(f"warehouse filled ({filler.stat().st_size:,} bytes of filler, {LEFT:,} left)")
        run = Run(1, env, work, "clickstream")
        try:
            failed_rc = _finish(run)
        finally:
            if run.alive():
                run.terminate_all()
        after_failure, unreadable_then = _published(output)
        filler.unlink()  # space again: the next runs must finish the work
        _drain(server, work, env, db_url, "clickstream")
        counts, unreadable = _published(output)
        missing = sum(1 for event_id in expected.events if event_id not in counts)
        duplicates = sum(n - 1 for n in counts.values())
        log(
            f"RESULT disk full: failed run exit {failed_rc}, published then "
            f"{sum(after_failure.values())} rows ({len(unreadable_then)} unreadable files); "
            f"at the end rows={sum(counts.values())} duplicates={duplicates} missing={missing} "
            f"unreadable={len(unreadable)}"
        )
        assert unreadable_then == [] and unreadable == []
        assert failed_rc != 0, "a run whose writes failed exited 0"
        assert duplicates == 0 and missing == 0
        verdict = verify(output, db_url, "clickstream", expected)
        print(verdict.line("disk full"), flush=True)
        assert verdict.unexpected == 0 and verdict.wrong == 0
        assert verdict.splits == {"COMPLETED": verdict.splits.get("COMPLETED", -1)}
        written = sum(p.stat().st_size for p in output.rglob("*.parquet"))
        assert written > 2 * LEFT, f"the output ({written:,} bytes) would have fit: no fault"


# -- the Postgres sink's table refuses writes --------------------------------------------------

_REFUSE = """
CREATE TABLE public.refuse_writes (why text);
CREATE FUNCTION public.refuse_writes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM public.refuse_writes) THEN
        RAISE EXCEPTION USING MESSAGE = 'writes refused into ' || TG_TABLE_NAME;
    END IF;
    RETURN NEW;
END $$;
INSERT INTO public.refuse_writes VALUES ('test');
"""


def _execute(db_url: str, statements: str) -> None:
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(statements)
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "table",
    # Both `extended` (make faults only, CI's time budget): the refusals of both tables are
    # covered without Spark by tests/integration/test_sink_refusals.py in make test.
    [
        pytest.param("__sluice_staged_", marks=pytest.mark.extended),
        pytest.param("orders_enriched", marks=pytest.mark.extended),
    ],
)
def test_a_table_refusing_writes_fails_the_run_and_loses_nothing(
    postgres: tuple[OwnPostgres, Path], table: str
) -> None:
    server, root = postgres
    name = "staging" if table.startswith("__sluice") else "target"
    work = root / f"refused_{name}"
    work.mkdir()
    db_url = server.create_database(f"errors_refused_{name}")
    env = sluice_env(_settings(work, db_url, "examples.orders"), work)
    sluice(env, work, "db", "upgrade")
    demo = {
        "SLUICE_DEMO_EVENTS": "6000",
        "SLUICE_DEMO_DAYS": "2",
        "SLUICE_DEMO_FILES_PER_DAY": "3",
        "SLUICE_DEMO_USERS": "2000",
        "SLUICE_DEMO_SEED": "21",
    }
    sluice({**env, **demo}, work, "demo-data", "orders")
    sluice(env, work, "discover", "orders")
    # `sluice run` creates the sink's tables before its Spark stage starts (seconds before
    # the first write): the trigger goes on as soon as they exist.
    _execute(db_url, _REFUSE)
    if name == "staging":  # every batch table refuses, from its batch's first COPY
        _execute(db_url, "CREATE SCHEMA IF NOT EXISTS analytics")
        _execute(db_url, refuse_batch_tables("analytics", "public.refuse_writes"))
    run = Run(1, env, work, "orders")
    try:
        if name == "target":
            _arm_trigger_when_created(db_url, table, run)
        failed_rc = _finish(run)
    finally:
        if run.alive():
            run.terminate_all()
    said = run_summary(run.output())  # the error the failed run ended with
    _execute(db_url, "DELETE FROM public.refuse_writes")  # the table accepts writes again
    _drain(server, work, env, db_url, "orders")
    verdict = verify_orders(db_url, "orders", landed_orders(work / "data" / "landing" / "orders"))
    print(verdict.line(f"refused {name}"), flush=True)
    assert failed_rc != 0, "a run whose sink writes were refused exited 0"
    assert f"writes refused into {table}" in said, f"the failed run does not say why: {said}"
    assert verdict.missing == 0 and verdict.unexpected == 0 and verdict.wrong == 0
    assert verdict.duplicates == 0
    assert verdict.committed_rows == verdict.expected_rows == verdict.rows
    assert verdict.staged_left == 0


def _arm_trigger_when_created(db_url: str, table: str, run: Run, timeout: float = 90.0) -> None:
    """Put the refusing trigger on ``analytics.<table>`` as soon as the run created it."""
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and run.alive():
            with engine.begin() as conn:
                exists = conn.exec_driver_sql(
                    "SELECT to_regclass(%(t)s) IS NOT NULL", {"t": f"analytics.{table}"}
                ).scalar_one()
                if exists:
                    conn.exec_driver_sql(
                        f"CREATE TRIGGER refuse BEFORE INSERT ON analytics.{table}"
                        " FOR EACH ROW EXECUTE FUNCTION public.refuse_writes()"
                    )
                    return
            time.sleep(0.02)
        raise AssertionError(f"analytics.{table} was never created:\n{run.output()[-3000:]}")
    finally:
        engine.dispose()
