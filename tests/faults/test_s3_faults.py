"""Exactly-once on an object store under faults (issue 22): the clickstream with its landing
AND its warehouse on an S3 server (moto on 127.0.0.1, ``tests/s3_server.py``, through
pyarrow's real S3 client), while the seeded killer SIGKILLs Spark Python workers and the
driver, crash-restarts Postgres, and makes the S3 endpoint refuse connections for a few
seconds mid-run (``S3Server.pause()`` / ``resume()``: its objects kept).

Runs go through the ``sluice`` CLI in subprocesses (``SLUICE_PIPELINES`` =
``tests.faults.s3_clickstream``), rerun after every failure until everything is committed,
with top-up batches (uploaded objects, then ``sluice discover``) while kills are left. The
output read back from the bucket must hold every well-formed landed event exactly once with
the right enrichment (``duplicates=0 missing=0``); no split may be quarantined (an outage is
not bad content); nothing staged may be left; every completed day is reported to Dagster
once. ``SLUICE_FAULTS_SEED=<n>`` replays a schedule.

``extended``: ``make faults`` runs it, ``make test`` leaves it out (CI's time budget).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pytest
from fault_harness import (
    REPO,
    Chaos,
    Driver,
    OwnPostgres,
    Run,
    expected_events,
    log,
    make_root,
    remove,
    sluice,
    sluice_env,
    verify,
)
from fault_reporting import report_completions_once
from s3_landing import MODULE, PIPELINE, ObjectLanding, objects_under, read_back
from s3_server import S3Server, s3_server

from enumerator_service._database import asyncpg_dsn
from examples._clickstream_data import DemoSpec, generate_events, load_users

pytestmark = [
    pytest.mark.faults,
    pytest.mark.extended,
    pytest.mark.spark,
    pytest.mark.timeout(1800),
]

SEED = int(os.environ.get("SLUICE_FAULTS_SEED", "20260101")) + 22
LEASE_SECONDS = 4.0
#: Every kind twice (the order shuffled by the seed): "s3" is the endpoint refusing
#: connections for S3_DOWNTIME seconds while the run goes on.
PLAN = ["worker"] * 2 + ["driver"] * 2 + ["postgres"] * 2 + ["s3"] * 2
KINDS = {"worker", "driver", "postgres", "s3"}
S3_DOWNTIME = (2.0, 6.0)
#: At most this much longer when no request of the run met the outage yet.
S3_MAX_EXTRA = 20.0
EVENTS = 50_000
USERS = 20_000
TOP_UP_EVENTS = 25_000
TOP_UP_EVENTS_MAX = 200_000
MAX_TOP_UPS = 16
BUCKET = "sluice-faults"


#: What a request that met the closed endpoint leaves in a run's log (pyarrow's error in a
#: task's traceback, or Sluice's one-line storage error).
REFUSED = ("NETWORK_CONNECTION", "Could not connect", "is unreachable")


def _refusals(run: Run) -> int:
    text = run.output()
    return sum(text.count(marker) for marker in REFUSED)


@dataclass
class S3Driver(Driver):
    """The harness's driver, with one more kind of fault: the S3 endpoint unreachable."""

    s3: S3Server | None = None
    #: Outages that a request of the run met (its log shows the refusal).
    felt: int = 0

    def _kill(self, run: Run, kind: str) -> str:
        if kind != "s3":
            return super()._kill(run, kind)
        assert self.s3 is not None
        before = _refusals(run)
        began = time.monotonic()
        self.s3.pause()
        try:
            time.sleep(self.chaos.rng.uniform(*S3_DOWNTIME))
            # An outage between two requests would test nothing: kept (bounded) until a
            # request of the run met it.
            deadline = time.monotonic() + S3_MAX_EXTRA
            while _refusals(run) == before and run.alive() and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            self.s3.resume()
        refused = _refusals(run) - before
        self.felt += refused > 0
        return (
            f"S3 endpoint refused connections for {time.monotonic() - began:.1f}s (objects "
            f"kept; {refused} refusals in the run's log), resumed"
        )


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


def test_s3_landing_and_warehouse_exactly_once_under_kills_and_an_unreachable_endpoint(
    fault_root: tuple[Path, OwnPostgres],
) -> None:
    root, server = fault_root
    work, generated = root / "run", root / "generated"
    work.mkdir()
    db_url = server.create_database("faults_s3")
    python_path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    with s3_server() as s3:
        s3.create_bucket(BUCKET)
        landing = ObjectLanding(s3, BUCKET, "landing/events", generated)
        env = sluice_env(
            {
                "SLUICE_DATABASE_URL": db_url,
                "SLUICE_PIPELINES": MODULE,
                "SLUICE_TEST_S3_LANDING": landing.uri,
                "SLUICE_WAREHOUSE_DIR": f"s3://{BUCKET}/warehouse",
                "SLUICE_S3_ENDPOINT_URL": s3.endpoint_url,
                "SLUICE_S3_REGION": "us-east-1",
                "SLUICE_HOME": str(work / "home"),
                # Never created: landing and warehouse are in the bucket.
                "SLUICE_DATA_DIR": str(work / "data"),
                "SLUICE_FILE_SETTLE_SECONDS": "0",
                "SLUICE_SPARK_MASTER": "local[2]",
                "SLUICE_PARALLELISM": "2",
                "SLUICE_LEASE_SECONDS": str(LEASE_SECONDS),
                "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "1",
                "SLUICE_CHECKPOINT_TIMEOUT_SECONDS": "20",
                "SLUICE_LOOKUP_TIMEOUT_SECONDS": "20",
                # Byte-range splits of ~256 KiB; blocks of ~400 events.
                "SLUICE_TARGET_SPLIT_BYTES": str(256 << 10),
                "SLUICE_READ_BLOCK_BYTES": str(64 << 10),
                "PYTHONPATH": python_path,
            },
            work,
        )
        sluice(env, work, "db", "upgrade")
        load_users(
            asyncpg_dsn(db_url), schema="public", table="users", key="id", users=USERS, seed=7
        )
        batches: list[DemoSpec] = []
        chaos = Chaos(SEED, list(PLAN))

        def land_batch() -> bool:
            """Generate a batch locally (the oracle's copy), PUT its objects, discover."""
            if len(batches) > MAX_TOP_UPS:
                return False
            first = not batches
            top_up = batches[-1].events if len(batches) > 1 else TOP_UP_EVENTS
            spec = DemoSpec(
                events=EVENTS if first else chaos.next_batch_size(top_up, TOP_UP_EVENTS_MAX),
                days=2 if first else 1,
                files_per_day=4,
                users=USERS,
                start_date=date(2026, 1, 1) + timedelta(days=len(batches) + (not first)),
                seed=7 + len(batches),
            )
            generate_events(generated, spec)
            uploaded = landing.upload_new()
            batches.append(spec)
            log(
                f"landed {spec.events:,} events from {spec.start_date} in {uploaded} objects; "
                + sluice(env, work, "discover", PIPELINE).strip()
            )
            return True

        land_batch()
        driver = S3Driver(
            chaos, env, work, server, db_url, PIPELINE, LEASE_SECONDS, top_up=land_batch, s3=s3
        )
        started = time.monotonic()
        try:
            driver.spend_budget()
            driver.drain()
        finally:
            driver.close()
            print(chaos.timeline(), flush=True)
        log(
            f"S3: {len(chaos.kills)} faults, {len(chaos.runs)} runs, "
            f"{time.monotonic() - started:.1f}s; {len(batches)} batches, "
            f"{sum(b.events for b in batches):,} events in {len(landing.objects())} objects"
        )
        assert {kill.kind for kill in chaos.kills} == KINDS
        assert len(chaos.kills) == len(PLAN)
        assert driver.felt >= 1, "no request of any run met an S3 outage"

        table = f"{BUCKET}/warehouse/enriched_events"
        output, other = read_back(s3, table, root / "read-back")
        expected = expected_events(generated)
        verdict = verify(output, db_url, PIPELINE, expected)
        print(verdict.line("S3_EXACTLY_ONCE"), flush=True)
        assert other == [], f"objects in the table that are not its data files: {other}"
        assert objects_under(s3, f"{BUCKET}/warehouse/_staging") == []
        # An outage is not bad content: nothing quarantined, everything committed.
        assert verdict.splits == {"COMPLETED": verdict.splits.get("COMPLETED", -1)}
        assert verdict.duplicates == 0 and verdict.missing == 0 and verdict.unexpected == 0
        assert verdict.wrong == 0 and verdict.dead_letters == verdict.malformed
        assert not (work / "data").exists()
        reporting = report_completions_once(env, PIPELINE)
        log(reporting.line())
        assert reporting.completed
        assert dict(reporting.materialized) == dict.fromkeys(reporting.completed, 1)
        assert reporting.unreported == 0 and reporting.reported_again == 0
        assert reporting.open_days == []
