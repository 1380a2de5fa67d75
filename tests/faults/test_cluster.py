"""A pipeline on a real Spark standalone cluster (master + one worker from the pyspark wheel,
``spark.authenticate`` on): `sluice run clickstream` on ``spark://127.0.0.1:…`` while the
worker's executor JVM is SIGKILLed mid-run. The master starts a new executor, the barrier
stage restarts, and the output holds every landed event exactly once."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest
from fault_harness import (
    OwnPostgres,
    Run,
    expected_events,
    log,
    make_root,
    remove,
    run_summary,
    sluice,
    sluice_env,
    split_counts,
    verify,
)
from spark_cluster import StandaloneCluster

from enumerator_service._database import asyncpg_dsn
from examples._clickstream_data import DemoSpec, generate_events, load_users

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

PIPELINE = "clickstream"
EVENTS = 20_000
USERS = 5_000
RUN_TIMEOUT = 120.0


def _stage_attempts(folder: Path) -> dict[tuple[int, int], set[int]]:
    """(stage, attempt) → the task indexes started in it, from Spark's event log."""
    started: dict[tuple[int, int], set[int]] = {}
    for path in folder.iterdir():
        for line in path.read_text(errors="replace").splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskStart":
                key = (event["Stage ID"], event["Stage Attempt ID"])
                started.setdefault(key, set()).add(event["Task Info"]["Index"])
    return started


@pytest.fixture
def cluster_root(request: pytest.FixtureRequest) -> Iterator[tuple[Path, OwnPostgres, str]]:
    root = make_root()
    server = OwnPostgres(root)
    failed_before = request.session.testsfailed
    try:
        yield root, server, server.create_database("cluster")
    finally:
        server.stop()
        if request.session.testsfailed > failed_before or os.environ.get("SLUICE_FAULTS_KEEP"):
            log(
                f"kept {root} (Spark daemon logs under cluster/logs, executors' under cluster/work)"
            )
        else:
            remove(root)


def test_a_run_on_a_standalone_cluster_survives_a_killed_executor(
    cluster_root: tuple[Path, OwnPostgres, str],
) -> None:
    root, _server, db_url = cluster_root
    work = root / "run"
    work.mkdir()
    # The worker (and so its executors) gets the database URL from its environment.
    cluster = StandaloneCluster(
        root / "cluster", cores=2, worker_env={"SLUICE_DATABASE_URL": db_url}
    )
    run: Run | None = None
    try:
        env = sluice_env(
            {
                "SLUICE_DATABASE_URL": db_url,
                "SLUICE_PIPELINES": "examples.clickstream",
                "SLUICE_HOME": str(work / "home"),
                "SLUICE_DATA_DIR": str(work / "data"),
                "SLUICE_SPARK_MASTER": cluster.url,
                "SLUICE_SPARK_DRIVER_HOST": "127.0.0.1",
                "SLUICE_SPARK_AUTH_SECRET_FILE": str(cluster.secret_file),
                "SLUICE_PARALLELISM": "2",
                "SLUICE_LEASE_SECONDS": "5",
                "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "0.5",
                "SLUICE_CHECKPOINT_TIMEOUT_SECONDS": "10",
                "SLUICE_TARGET_SPLIT_BYTES": str(128 << 10),
                # ~800 blocks looked up one at a time, 20 ms each: the run takes seconds, so
                # the kill lands while some splits are committed and others are not.
                "SLUICE_READ_BLOCK_BYTES": "4096",
                "SLUICE_LOOKUP_CAPACITY": "1",
                "SLUICE_LOOKUP_INJECTED_LATENCY_MS": "20",
            },
            work,
        )
        # Spark's event log of the driver (spark-defaults.conf of SPARK_CONF_DIR): it shows
        # which stage attempts ran.
        conf, events = work / "spark-conf", work / "spark-events"
        conf.mkdir()
        events.mkdir()
        (conf / "spark-defaults.conf").write_text(
            f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\n"
            "spark.eventLog.compress false\nspark.eventLog.rolling.enabled false\n"
        )
        env["SPARK_CONF_DIR"] = str(conf)
        landing = work / "data" / "landing" / "events"
        output = work / "data" / "warehouse" / "enriched_events"
        sluice(env, work, "db", "upgrade")
        load_users(
            asyncpg_dsn(db_url), schema="public", table="users", key="id", users=USERS, seed=7
        )
        generate_events(
            landing,
            DemoSpec(
                events=EVENTS,
                days=2,
                files_per_day=3,
                users=USERS,
                start_date=date(2026, 1, 1),
                seed=7,
            ),
        )
        sluice(env, work, "discover", PIPELINE)
        total = sum(split_counts(db_url, PIPELINE).values())

        run = Run(1, env, work, PIPELINE)
        started = time.monotonic()
        killed: int | None = None
        while killed is None and run.alive() and time.monotonic() - started < RUN_TIMEOUT:
            committed = split_counts(db_url, PIPELINE).get("COMPLETED", 0)
            executors = cluster.executors()
            if executors and 0 < committed < total:
                killed = executors[0].pid
                os.kill(killed, signal.SIGKILL)
                log(f"SIGKILLed executor {killed} with {committed} of {total} splits committed")
            time.sleep(0.1)
        code = run.wait(max(1.0, RUN_TIMEOUT - (time.monotonic() - started)))
        output_text = run.output()
        assert code == 0, f"run failed or hung (exit {code}):\n{output_text[-4000:]}"
        assert killed is not None, f"the run ended before the kill: {run_summary(output_text)}"
        log(f"run: {run_summary(output_text)} in {time.monotonic() - started:.1f} s")
        # The worker started a new executor, and the barrier stage ran again as a whole.
        launched = (cluster.root / "logs" / "worker.out").read_text(errors="replace")
        assert launched.count("Asked to launch executor") >= 2
        attempts = _stage_attempts(events)
        log(f"tasks started per (stage, attempt): {attempts}")
        assert any(len(tasks) == 2 for (_, attempt), tasks in attempts.items() if attempt >= 1), (
            f"no second attempt of the 2-task barrier stage: {attempts}"
        )

        verdict = verify(output, db_url, PIPELINE, expected_events(landing))
        log(verdict.line("CLUSTER"))
        assert verdict.splits == {"COMPLETED": total}
        assert verdict.duplicates == 0 and verdict.missing == 0 and verdict.unexpected == 0
        assert verdict.wrong == 0 and verdict.dead_letters == verdict.malformed
        assert cluster.secret not in output_text
    finally:
        if run is not None and run.alive():
            run.terminate_all()
        cluster.stop()
