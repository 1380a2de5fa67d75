"""A pipeline on a real Spark standalone cluster (master + one worker from the pyspark wheel,
``spark.authenticate`` on):

- `sluice run clickstream` on ``spark://127.0.0.1:…`` while the worker's executor JVM is
  SIGKILLed mid-run. The master starts a new executor, the barrier stage restarts, and the
  output holds every landed event exactly once;
- issue 22: the clickstream with landing and warehouse on an S3 server (moto on 127.0.0.1),
  the worker in another working directory with no ``SLUICE_DATA_DIR`` and no way to the
  driver's data folder (never created: nothing may need it). The worker has the AWS
  credentials in its environment (the standard chain); the endpoint travels with the run's
  StorageOptions. The output read back from the bucket is the oracle's, exactly once.
"""

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
    REPO,
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
from s3_landing import MODULE as S3_MODULE
from s3_landing import PIPELINE as S3_PIPELINE
from s3_landing import ObjectLanding, objects_under, read_back
from s3_server import s3_server
from spark_cluster import StandaloneCluster

from enumerator_service._database import asyncpg_dsn
from examples._clickstream_data import DemoSpec, generate_events, load_users

# `make faults` only: ~75 s, and `make test` is at CI's time limit.
pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(300), pytest.mark.extended]

PIPELINE = "clickstream"
EVENTS = 20_000
USERS = 5_000
RUN_TIMEOUT = 200.0
#: A run without kills; Python workers took 17 s to boot on 2 cores shared with other work.
S3_RUN_TIMEOUT = 300.0


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


# About 2-3 minutes (a cluster, a Spark JVM of its own, S3 both ways): `make faults` runs it,
# `make test` leaves it out (CI's time budget; the S3 paths it crosses are tested in
# tests/integration/test_s3_*.py and tests/examples/test_examples_on_s3.py).
@pytest.mark.faults
@pytest.mark.extended
@pytest.mark.timeout(480)
def test_a_standalone_cluster_reads_and_writes_s3_without_the_drivers_data_folder(
    cluster_root: tuple[Path, OwnPostgres, str],
) -> None:
    root, _server, db_url = cluster_root
    work, worker_home, generated = root / "run", root / "worker-home", root / "generated"
    for folder in (work, worker_home, generated):
        folder.mkdir()
    # The driver's data folder: named, never created, never readable by anyone.
    driver_data = work / "data"
    python_path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    with s3_server() as s3:
        bucket = "sluice-cluster"
        s3.create_bucket(bucket)
        landing = ObjectLanding(s3, bucket, "landing/events", generated)
        aws = {k: v for k, v in s3.env.items() if k.startswith("AWS_")}
        # The worker: its own working directory, no SLUICE_DATA_DIR (the cluster passes no
        # SLUICE_* of ours), the database URL and the standard AWS chain in its environment.
        cluster = StandaloneCluster(
            root / "cluster",
            cores=2,
            worker_env={"SLUICE_DATABASE_URL": db_url, "PYTHONPATH": python_path, **aws},
            worker_cwd=worker_home,
        )
        run: Run | None = None
        try:
            env = sluice_env(
                {
                    "SLUICE_DATABASE_URL": db_url,
                    "SLUICE_PIPELINES": S3_MODULE,
                    "SLUICE_TEST_S3_LANDING": landing.uri,
                    "SLUICE_WAREHOUSE_DIR": f"s3://{bucket}/warehouse",
                    "SLUICE_S3_ENDPOINT_URL": s3.endpoint_url,
                    "SLUICE_S3_REGION": "us-east-1",
                    "SLUICE_HOME": str(work / "home"),
                    "SLUICE_DATA_DIR": str(driver_data),
                    "SLUICE_FILE_SETTLE_SECONDS": "0",
                    "SLUICE_SPARK_MASTER": cluster.url,
                    "SLUICE_SPARK_DRIVER_HOST": "127.0.0.1",
                    "SLUICE_SPARK_AUTH_SECRET_FILE": str(cluster.secret_file),
                    "SLUICE_PARALLELISM": "2",
                    "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "0.5",
                    "SLUICE_TARGET_SPLIT_BYTES": str(128 << 10),
                    "PYTHONPATH": python_path,
                },
                work,
            )
            sluice(env, work, "db", "upgrade")
            load_users(
                asyncpg_dsn(db_url), schema="public", table="users", key="id", users=USERS, seed=7
            )
            generate_events(
                generated,
                DemoSpec(
                    events=EVENTS,
                    days=2,
                    files_per_day=3,
                    users=USERS,
                    start_date=date(2026, 1, 1),
                    seed=11,
                ),
            )
            assert landing.upload_new() == 6
            sluice(env, work, "discover", S3_PIPELINE)
            total = sum(split_counts(db_url, S3_PIPELINE).values())
            assert total > 6  # byte ranges of the objects

            run = Run(1, env, work, S3_PIPELINE)
            code = run.wait(S3_RUN_TIMEOUT)
            if code is None:
                stacks = run.diagnose()
                run.terminate_all()
                raise AssertionError(f"the run hung; stacks:\n{stacks}\n{run.output()[-4000:]}")
            output_text = run.output()
            assert code == 0, f"run failed (exit {code}):\n{output_text[-4000:]}"
            log(f"S3 cluster run: {run_summary(output_text)}")
            launched = (cluster.root / "logs" / "worker.out").read_text(errors="replace")
            assert "Asked to launch executor" in launched

            table = f"{bucket}/warehouse/enriched_events"
            output, other = read_back(s3, table, root / "read-back")
            assert other == [], f"objects in the table that are not its data files: {other}"
            assert objects_under(s3, f"{bucket}/warehouse/_staging") == []
            verdict = verify(output, db_url, S3_PIPELINE, expected_events(generated))
            log(verdict.line("S3_CLUSTER"))
            assert verdict.splits == {"COMPLETED": total}
            assert verdict.duplicates == 0 and verdict.missing == 0 and verdict.unexpected == 0
            assert verdict.wrong == 0 and verdict.dead_letters == verdict.malformed
            assert verdict.rows == len(expected_events(generated).events) > 0
            # Nothing anywhere needed (or wrote) a data folder: not the driver's, not one
            # under the worker's working directory or its executors' folders.
            assert not driver_data.exists()
            strays = [
                p
                for base in (worker_home, cluster.root / "work")
                for p in base.rglob("*")
                if p.name in ("data", "landing", "warehouse")
            ]
            assert strays == [], strays
            assert cluster.secret not in output_text
            assert "sluice-test-secret" not in output_text
        finally:
            if run is not None and run.alive():
                run.terminate_all()
            cluster.stop()
