"""A Dagster daemon restart during a sensor-driven continuous run: exactly-once, and no split
left with a dead run.

A real ``dagster-daemon run`` (its own DAGSTER_HOME in a temp folder, the instance of
``docker/dagster.yaml`` with SQLite in place of Postgres: queued runs, run monitoring) runs the
``clickstream_continuous`` sensor, which requests the continuous run and feeds it the files
landing over time. Mid-stream the daemon's whole session is SIGKILLed — the daemon, its code
server, the run worker with its Spark driver, JVM and Python workers: what a restart of the
daemon's container does. Dagster then still shows the run as STARTED (the default run launcher
cannot see its worker die). The daemon is started again and more files land: the sensor must
find the run dead by its lease heartbeat, report it failed, give its splits to a successor,
and the output must hold every landed event exactly once.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dagster_daemon import Daemon, dagster_cli, instance_config, runs_of, workspace
from fault_harness import (
    OwnPostgres,
    _cmdline,
    expected_events,
    log,
    make_root,
    remove,
    sluice,
    sluice_env,
    split_counts,
    verify,
)

from enumerator_service._database import asyncpg_dsn
from examples._clickstream_data import DemoSpec, generate_events, load_users

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(900)]

PIPELINE = "clickstream"
SENSOR = f"{PIPELINE}_continuous"
USERS = 5_000
#: Long enough that a starting driver (Spark start-up on a busy machine) renews in time,
#: short enough to find the dead run within a minute of the kill.
LEASE_SECONDS = 20
#: No single wait may exceed this.
WAIT = 240.0


def _wait(what: str, condition: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)
    log(f"reached: {what}")


def _runs(home: Path) -> list[dict[str, Any]]:
    """The continuous runs in the instance: status, tags."""
    return runs_of(home, {"sluice/mode": "continuous"})


def _failure_messages(home: Path, run_id: str) -> list[str]:
    from dagster import DagsterEventType, DagsterInstance

    with DagsterInstance.from_config(str(home)) as instance:
        return [
            entry.message or ""
            for entry in instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
        ]


def _active_owners(db_url: str) -> dict[str, int]:
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT run_id, count(*) FROM sluice.splits WHERE source = :s AND status IN "
                    "('ASSIGNED', 'READING') GROUP BY run_id"
                ),
                {"s": PIPELINE},
            ).all()
    finally:
        engine.dispose()
    return {str(run_id): int(n) for run_id, n in rows}


@pytest.fixture
def work(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path, list[Daemon]]]:
    """Our own Postgres, a work folder, and every daemon the test starts: all stopped at the
    end, also on failure (the folder is kept when the test failed)."""
    root = make_root()
    server = OwnPostgres(root)
    daemons: list[Daemon] = []
    failed_before = request.session.testsfailed
    try:
        yield server, root, daemons
    finally:
        for daemon in daemons:
            with contextlib.suppress(Exception):
                daemon.kill()
        server.stop()
        if request.session.testsfailed > failed_before or os.environ.get("SLUICE_FAULTS_KEEP"):
            log(f"kept {root} (daemon logs under logs/, Postgres log in pg/log)")
        else:
            remove(root)


# `extended`: make faults runs it, make test leaves it out (CI's time budget); the continuous
# mode under a real daemon is in make test through tests/dagster/test_continuous_daemon.py.
@pytest.mark.extended
def test_daemon_restart_during_a_continuous_run(
    work: tuple[OwnPostgres, Path, list[Daemon]],
) -> None:
    server, root, daemons = work
    started = time.monotonic()
    db_url = server.create_database("faults_daemon")
    home = root / "dagster_home"
    instance_config(home)
    workspace(root)
    settings = {
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_PIPELINES": f"examples.{PIPELINE}",
        "SLUICE_HOME": str(root / "home"),
        "SLUICE_DATA_DIR": str(root / "data"),
        "SLUICE_SPARK_MASTER": "local[2]",
        "SLUICE_PARALLELISM": "2",
        "SLUICE_LEASE_SECONDS": str(LEASE_SECONDS),
        "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "1",
        "SLUICE_CONTINUOUS_POLL_SECONDS": "0.5",
        # The run ends after idling this long once everything is read (its output published).
        "SLUICE_CONTINUOUS_IDLE_SECONDS": "20",
        "SLUICE_TARGET_SPLIT_BYTES": str(64 << 10),
        # Slow lookups keep the run busy with its splits when the kill comes: blocks of 4 KiB,
        # one in flight, 20 ms each make a batch of 20k events last ~7 s. (With the default
        # 256 KiB blocks, 8 in flight, batched pulls read it in about a second: the run
        # could finish batch 2 between two polls, and the kill would find nothing held.)
        "SLUICE_LOOKUP_INJECTED_LATENCY_MS": "20",
        "SLUICE_READ_BLOCK_BYTES": "4096",
        "SLUICE_LOOKUP_CAPACITY": "1",
    }
    env = {**sluice_env(settings, root), "DAGSTER_HOME": str(home)}
    landing = root / "data" / "landing" / "events"
    output = root / "data" / "warehouse" / "enriched_events"
    sluice(env, root, "db", "upgrade")
    load_users(asyncpg_dsn(db_url), schema="public", table="users", key="id", users=USERS, seed=7)
    batches = 0

    def land(events: int) -> None:
        nonlocal batches
        spec = DemoSpec(
            events=events,
            days=1,
            files_per_day=4,
            users=USERS,
            start_date=date(2026, 1, 1) + timedelta(days=batches),
            seed=11 + batches,
        )
        generate_events(landing, spec)
        batches += 1
        log(f"landed batch {batches}: {events:,} events on {spec.start_date}")

    land(20_000)
    turned_on = dagster_cli(env, root, "dagster", "sensor", "start", SENSOR, "-w", "workspace.yaml")
    assert turned_on.returncode == 0, turned_on.stderr
    daemons.append(Daemon(env, root, 1))
    # The compose healthcheck of dagster-daemon, against the real daemon.
    _wait(
        "dagster-daemon liveness-check passes",
        lambda: dagster_cli(env, root, "dagster-daemon", "liveness-check").returncode == 0,
    )

    # The sensor requests generation 1; the run starts reading.
    def first_run() -> dict[str, Any] | None:
        runs = [r for r in _runs(home) if r["tags"].get("sluice/generation") == "1"]
        return runs[0] if runs else None

    _wait(
        "generation 1 STARTED and reading",
        lambda: (
            (run := first_run()) is not None
            and run["status"] == "STARTED"
            and split_counts(db_url, PIPELINE).get("COMPLETED", 0) > 0
        ),
    )
    run = first_run()
    assert run is not None
    dead_run, dead_sluice_run = run["id"], run["tags"]["sluice/run_id"]
    # More files while it runs: the sensor registers them and assigns them to the live run.
    registered = sum(split_counts(db_url, PIPELINE).values())
    land(20_000)
    _wait(
        "batch 2 assigned to the live run",
        lambda: (
            (counts := split_counts(db_url, PIPELINE)).get("UNASSIGNED", 0) == 0
            and sum(counts.values()) > registered
            and _active_owners(db_url).get(dead_sluice_run, 0) > 0
        ),
    )
    # The container restarts: the daemon, its code server, the run worker and its Spark die.
    procs = daemons[0].processes()
    for proc in procs:
        log(f"  in the daemon's session: {proc.pid} {_cmdline(proc)[:150]}")
    # The run's Spark driver JVM is among them: the kill hits the live run.
    assert any("java" in _cmdline(p) and "pyspark" in _cmdline(p) for p in procs)
    holding = _active_owners(db_url).get(dead_sluice_run, 0)
    killed = daemons[0].kill()
    log(f"SIGKILLed the daemon's session ({len(killed)} processes); the run held {holding}")
    (still,) = [r for r in _runs(home) if r["id"] == dead_run]
    assert still["status"] == "STARTED"  # what Dagster believes
    time.sleep(3)
    daemons.append(Daemon(env, root, 2))
    land(10_000)
    # The sensor finds the run dead (lease heartbeat), reports it, and a successor takes over.
    _wait(
        "the dead run is reported failed and replaced",
        lambda: any(r["tags"].get("sluice/replaces") == dead_run for r in _runs(home)),
    )
    (dead,) = [r for r in _runs(home) if r["id"] == dead_run]
    assert dead["status"] == "FAILURE"
    assert any("lease heartbeat stopped" in m for m in _failure_messages(home, dead_run))
    assert dead_sluice_run not in _active_owners(db_url)
    land(10_000)
    # Everything read, published, and the successor ended after idling.
    _wait(
        "every split COMPLETED and no continuous run in progress",
        lambda: (
            set(split_counts(db_url, PIPELINE)) == {"COMPLETED"}
            and not any(
                r["status"] in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING")
                for r in _runs(home)
            )
        ),
        timeout=WAIT * 2,
    )
    runs = _runs(home)
    for r in runs:
        log(f"run {r['id']} gen {r['tags'].get('sluice/generation')}: {r['status']}")
    verdict = verify(output, db_url, PIPELINE, expected_events(landing))
    print(verdict.line("EXACTLY_ONCE daemon restart"), flush=True)
    assert verdict.duplicates == 0 and verdict.missing == 0
    assert verdict.unexpected == 0 and verdict.wrong == 0
    assert verdict.dead_letters == verdict.malformed
    # No split is left with a run: neither the dead one nor any other.
    assert _active_owners(db_url) == {}
    assert sum(r["status"] == "SUCCESS" for r in runs) >= 1
    log(f"daemon restart fault test: {batches} batches, {time.monotonic() - started:.0f}s")
