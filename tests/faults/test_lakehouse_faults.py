"""Exactly-once into a lakehouse table under faults: the clickstream and orders examples with
their sink replaced by the Delta sink or the Iceberg sink (``lakehouse_pipelines``; one
``Case`` per pipeline and sink), through the ``sluice`` CLI in subprocesses against a Postgres
server of the test's own (``fault_harness``). The Delta words below have Iceberg twins: the
log's app transactions are the snapshots' ``sluice.run-id``/``sluice.checkpoint-id``, delta-rs
is PyIceberg's scan, the log's current files are the current snapshot's (``lakehouse_iceberg``).

- Seeded random SIGKILLs of Spark Python workers and the driver and Postgres crash-restarts,
  then runs until everything is committed (``extended``): the table, read by delta-rs AND by
  DuckDB over the log's current files, equals the oracle (duplicates 0, missing 0); every app
  transaction version is in the log at most once, each is a checkpoint (with files) that
  Postgres committed, and each run's last such checkpoint is in the log (a recovery may fold
  several unpublished checkpoints into one commit).
- Deterministic kill points, no product-code hook (a connector subclass in the test's
  pipeline module): SIGKILL of the driver (a) after the files are staged and the checkpoint
  committed in Postgres, before the table commit, (b) after the table commit, before the
  transactions are marked published. A plain re-run recovers: exact output, and that
  checkpoint's version in the log exactly once. (a) is the smoke variant that `make test`
  runs (53 s measured at load 3-5 on 2 cores); it also sweeps orphans right after the
  kill: the checkpoint's staged files are unreferenced but pending, and must be kept.
- Postgres crashing under a final publish (``extended``): right after the table commit of
  the checkpoint that carries a subtask's final acknowledgement, before its transactions are
  marked published (the window where the orders-delta case once hung: the coordinator lost
  the completion, kept waiting for the finished subtask, and every later checkpoint timed
  out). The run must end by itself, the table exact.
- Orphans: files of attempts that died before acknowledging are in the table folder, named by
  no log entry. A worker SIGKILLed after its pre-commit closed its files (``extended``) makes
  them for certain (random kills rarely hit that window); they are counted here (pending ones
  excluded: none may be left once every transaction is published), the maintenance's orphan
  removal with grace 0 must remove exactly them, and the table still equals the oracle. The
  random-kill cases check the same after their runs.

``SLUICE_FAULTS_SEED=<n>`` replays a schedule; ``SLUICE_FAULTS_KEEP=1`` keeps the folders.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_harness import (
    RUN_TIMEOUT,
    Chaos,
    Driver,
    OwnPostgres,
    Run,
    log,
    make_root,
    remove,
    wait_gone,
)
from lakehouse_oracle import published_checkpoints
from lakehouse_pipelines import CRASH_PG_SETTING
from lakehouse_runs import (
    LEASE_SECONDS,
    Case,
    check_orphan_removal,
    check_pending_kept,
    check_table,
    prepare,
    view,
)

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(900)]

SEED = int(os.environ.get("SLUICE_FAULTS_SEED", "20260101")) + 40
KINDS = {"worker", "driver", "postgres"}
PLAN = ["worker"] * 2 + ["driver"] * 2 + ["postgres"] * 2
#: Runs (each with a batch landed before it) until one crashes Postgres under a final publish.
MAX_CRASH_RUNS = 4
CRASH_BATCH = 30_000

CASES = {
    "clickstream-delta": Case("delta", "clickstream_delta", "lake/enriched_events", "events"),
    "orders-delta": Case("delta", "orders_delta", "lake/orders_enriched", "orders_delta"),
    "clickstream-iceberg": Case(
        "iceberg", "clickstream_iceberg", "faults.enriched_events", "events"
    ),
    "orders-iceberg": Case(
        "iceberg", "orders_iceberg", "faults.orders_enriched", "orders_iceberg", "ordered_at"
    ),
}
#: The kill-point pipelines (the test connectors of ``lakehouse_pipelines``), per sink.
KILL_CASES = {
    "delta": Case("delta", "clickstream_delta_kill", "lake/enriched_events_kill", "events"),
    "iceberg": Case("iceberg", "clickstream_iceberg_kill", "faults.enriched_events_kill", "events"),
}


@pytest.fixture
def fault_root(request: pytest.FixtureRequest) -> Iterator[tuple[Path, OwnPostgres]]:
    root = make_root()
    server = OwnPostgres(root)
    log(f"own Postgres in {root} ({server.url})")
    failed_before = request.session.testsfailed
    try:
        yield root, server
    finally:
        server.stop()
        if request.session.testsfailed > failed_before or os.environ.get("SLUICE_FAULTS_KEEP"):
            log(f"kept {root} (run logs under run/logs, Postgres log in pg/log)")
        else:
            remove(root)


@pytest.mark.extended
@pytest.mark.parametrize("name", list(CASES))
def test_lakehouse_exactly_once_under_kills(
    fault_root: tuple[Path, OwnPostgres], name: str
) -> None:
    root, server = fault_root
    case = CASES[name]
    chaos = Chaos(SEED + len(name), list(PLAN))
    lander = prepare(root, server, case, chaos, name.replace("-", "_"))
    db_url = lander.env["SLUICE_DATABASE_URL"]
    lander()
    driver = Driver(
        chaos,
        lander.env,
        lander.work,
        server,
        db_url,
        case.pipeline,
        LEASE_SECONDS,
        top_up=lander,
    )
    started = time.monotonic()
    try:
        driver.spend_budget()
        driver.drain()
    finally:
        driver.close()
        print(chaos.timeline(), flush=True)
    log(
        f"{name}: {len(chaos.kills)} kills, {len(chaos.runs)} runs, "
        f"{time.monotonic() - started:.1f}s, {sum(lander.batches):,} records landed"
    )
    assert {kill.kind for kill in chaos.kills} == KINDS
    check_table(lander, db_url, name)
    check_orphan_removal(lander, db_url, name)


# All cases in `make faults` only (a ~55 s smoke case pushed `make test` to CI's time limit).
@pytest.mark.extended
@pytest.mark.parametrize("sink", ["delta", "iceberg"])
@pytest.mark.parametrize("point", ["before", "after"])
def test_driver_killed_around_the_table_commit_recovers_exactly(
    fault_root: tuple[Path, OwnPostgres], point: str, sink: str
) -> None:
    """SIGKILL of the driver at the first publish with files, before or after the table
    commit (Delta commit / Iceberg snapshot); a plain re-run recovers."""
    root, server = fault_root
    case = KILL_CASES[sink]
    lander = prepare(root, server, case, Chaos(SEED, []), f"kill_{sink}_{point}")
    db_url = lander.env["SLUICE_DATABASE_URL"]
    lander(first_size=6_000)
    killed = Run(1, {**lander.env, "SLUICE_TEST_KILL_AT": f"{point}:1"}, lander.work, case.pipeline)
    rc = killed.wait(180)
    assert rc == -9, f"the run was not killed at its publish (exit {rc}):\n{killed.output()}"
    assert not wait_gone(killed.session(), 30), "the killed run's processes outlived it"
    # What the kill left: one checkpoint committed in Postgres, not published.
    runs = published_checkpoints(db_url, case.pipeline)
    (run_id,) = runs
    assert runs[run_id]["unpublished"] > 0 and runs[run_id]["checkpoints"]
    checkpoint = max(runs[run_id]["checkpoints"])
    app = f"sluice-{case.pipeline}-{run_id}"
    before = view(lander, db_url).commits().versions_by_app().get(app, [])
    assert before == ([checkpoint] if point == "after" else []), before
    if point == "before":
        check_pending_kept(lander, db_url)
    # (no wait for the dead run's leases: drain waits for them only if a split is left)
    driver = Driver(
        Chaos(SEED, []), lander.env, lander.work, server, db_url, case.pipeline, LEASE_SECONDS
    )
    driver._number = 1
    try:
        driver.drain()
    finally:
        driver.close()
    after = view(lander, db_url).commits().versions_by_app().get(app, [])
    print(
        f"RESULT kill {point} the {sink} table commit: checkpoint {checkpoint} of the killed run "
        f"in the log {after.count(checkpoint)} time(s), versions {after}",
        flush=True,
    )
    assert after.count(checkpoint) == 1 and after[-1] == checkpoint
    check_table(lander, db_url, f"kill-{sink}-{point}")


@pytest.mark.extended
@pytest.mark.parametrize("sink", list(KILL_CASES))
def test_files_of_an_attempt_killed_before_acknowledging_are_the_orphans_removed(
    fault_root: tuple[Path, OwnPostgres], sink: str
) -> None:
    """A Spark Python worker SIGKILLed after its pre-commit closed its files, before the
    acknowledgement: runs until everything is committed; the dead attempt's files are the
    table's only unreferenced files, and the orphan removal takes exactly them."""
    root, server = fault_root
    case = KILL_CASES[sink]
    lander = prepare(root, server, case, Chaos(SEED, []), f"orphans_{sink}")
    db_url = lander.env["SLUICE_DATABASE_URL"]
    lander(first_size=6_000)
    flag = lander.work / "worker-killed.flag"
    lander.env["SLUICE_TEST_KILL_WORKER"] = str(flag)
    driver = Driver(
        Chaos(SEED, []), lander.env, lander.work, server, db_url, case.pipeline, LEASE_SECONDS
    )
    try:
        driver.drain()
    finally:
        driver.close()
    assert flag.exists(), "no worker staged files (the kill never came)"
    check_table(lander, db_url, f"dead-attempt-{sink}")
    assert check_orphan_removal(lander, db_url, f"dead-attempt-{sink}") >= 1


@pytest.mark.extended
def test_postgres_crashing_under_a_final_publish_does_not_hang_the_run(
    fault_root: tuple[Path, OwnPostgres],
) -> None:
    """Postgres crashes once the table commit of a checkpoint carrying one subtask's final
    acknowledgement returned (orders into Delta; restarted 1.5 s later), the other subtask
    still reading: the run ends by itself. (Both subtasks may finish in one checkpoint: then
    no crash came, and another batch is landed and run, at most ``MAX_CRASH_RUNS`` runs.)"""
    root, server = fault_root
    case = Case("delta", "orders_delta_kill", "lake/orders_enriched_kill", "orders_delta_kill")
    lander = prepare(root, server, case, Chaos(SEED, []), "pg_crash_delta")
    db_url = lander.env["SLUICE_DATABASE_URL"]
    env = {**lander.env, CRASH_PG_SETTING: server.control()}
    for number in range(1, MAX_CRASH_RUNS + 1):
        # Batches of CRASH_BATCH orders in 3 files a day: the subtask with two of a day's
        # files is still reading when the other one's last file is acknowledged (batches of
        # 3,000 were read by both within one checkpoint: no crash in 4 runs, under load).
        lander(first_size=CRASH_BATCH)
        before = server.postmaster_pid()
        run = Run(number, env, lander.work, case.pipeline)
        rc = run.wait(RUN_TIMEOUT)
        if rc is None:
            stacks = run.diagnose()
            run.terminate_all()
            raise AssertionError(f"run {number} hung after the crash; stacks:\n{stacks}")
        assert rc in (0, 3), run.output()[-4000:]
        assert not wait_gone(run.session(), 30), "the run's processes outlived it"
        crashed = server.postmaster_pid() not in (None, before)
        print(f"RESULT crash under a final publish: run {number} exit {rc}, crashed {crashed}")
        if crashed:
            break
    assert crashed, f"no run of {MAX_CRASH_RUNS} had a final publish with a subtask still open"
    driver = Driver(
        Chaos(SEED, []), lander.env, lander.work, server, db_url, case.pipeline, LEASE_SECONDS
    )
    driver._number = number
    try:
        driver.drain()
    finally:
        driver.close()
    check_table(lander, db_url, "pg-crash-delta")
