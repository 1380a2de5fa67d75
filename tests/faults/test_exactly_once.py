"""Exactly-once under faults: enrich 100k events while SIGKILLing Spark Python workers and the
Spark driver and crash-restarting Postgres at seeded random moments, recovering after each.

The output must then hold every well-formed input event exactly once with the right
enrichment (EXACTLY_ONCE), or at least once (AT_LEAST_ONCE: duplicates are counted). Runs
through the `sluice` CLI in subprocesses against a Postgres server of the test's own. The
seed is printed; ``SLUICE_FAULTS_SEED=<n>`` replays a schedule (moments are relative to the
runs' progress, so a replay is close, not identical).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import pytest
from enumerator_service._demo_data import DemoSpec, generate_events, load_users
from fault_harness import (
    Chaos,
    Driver,
    OwnPostgres,
    Verdict,
    expected_events,
    log,
    make_root,
    remove,
    sluice,
    sluice_env,
    verify,
)

from enumerator_service._database import asyncpg_dsn

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(1200)]

SEED = int(os.environ.get("SLUICE_FAULTS_SEED", "20260101"))
EVENTS = 100_000
USERS = 50_000
LEASE_SECONDS = 4.0
#: 10 kill points: every kind at least three times (the order is shuffled by the seed).
PLAN = ["worker"] * 4 + ["driver"] * 3 + ["postgres"] * 3
#: Top-up batches at most, and their size. Batched reading enriches a top-up in about a
#: second, so a kill moment often comes after a run's work: the stream needs enough batches
#: (each one more run) to spend every kill.
MAX_TOP_UPS = 24
TOP_UP_EVENTS = 50_000


@pytest.fixture(scope="module")
def postgres(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path]]:
    root = make_root()
    server = OwnPostgres(root)
    log(f"own Postgres in {root} ({server.url})")
    failed_before = request.session.testsfailed
    yield server, root
    server.stop()
    if request.session.testsfailed > failed_before or os.environ.get("SLUICE_FAULTS_KEEP"):
        log(f"kept {root} (run logs under */logs, Postgres log in pg/log)")
    else:
        remove(root)


def _fault_run(postgres: tuple[OwnPostgres, Path], mode: str, seed: int) -> Verdict:
    server, root = postgres
    work = root / mode.lower()
    work.mkdir()
    db_url = server.create_database(f"faults_{mode.lower()}")
    source = "events"
    settings = {
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_HOME": str(work / "home"),
        "SLUICE_DATA_DIR": str(work / "data"),
        "SLUICE_SOURCE_NAME": source,
        "SLUICE_SPARK_MASTER": "local[2]",
        "SLUICE_PARALLELISM": "2",
        "SLUICE_LEASE_SECONDS": str(LEASE_SECONDS),
        "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "1",
        "SLUICE_CHECKPOINT_TIMEOUT_SECONDS": "20",
        "SLUICE_CHECKPOINTING_MODE": mode,
        # ~60 byte-range splits of ~256 KiB over 12 files.
        "SLUICE_TARGET_SPLIT_BYTES": str(256 << 10),
        "SLUICE_LOOKUP_TIMEOUT_SECONDS": "20",
        # Blocks of ~400 events: more of them in flight (and in checkpoints) at each kill.
        "SLUICE_READ_BLOCK_BYTES": str(64 << 10),
    }
    env = sluice_env(settings, work)
    landing = work / "data" / "landing" / source
    sluice(env, work, "db", "upgrade")
    load_users(asyncpg_dsn(db_url), schema="public", table="users", key="id", users=USERS, seed=7)
    # The first batch: EVENTS events over 3 days. Should the kills not have been spent when
    # everything is committed, further batches land on the following days (the stream keeps
    # arriving) — on a fast machine 100k events take only a few seconds.
    batches: list[DemoSpec] = []

    def land_batch() -> bool:
        if len(batches) > MAX_TOP_UPS:
            return False
        first = not batches
        spec = DemoSpec(
            events=EVENTS if first else TOP_UP_EVENTS,
            days=3 if first else 1,
            files_per_day=4,
            users=USERS,
            start_date=date(2026, 1, 1) + timedelta(days=len(batches) + 2 * (not first)),
            seed=7 + len(batches),
        )
        generate_events(landing, spec)
        batches.append(spec)
        log(
            f"landed {spec.events:,} events from {spec.start_date}; "
            + sluice(env, work, "discover").strip()
        )
        return True

    land_batch()
    chaos = Chaos(seed, list(PLAN))
    driver = Driver(chaos, env, work, server, db_url, source, LEASE_SECONDS, top_up=land_batch)
    started = time.monotonic()
    try:
        driver.spend_budget()
        driver.drain()
    finally:
        driver.close()
        print(chaos.timeline(), flush=True)
    log(
        f"{mode}: {len(chaos.kills)} kills, {len(chaos.runs)} runs, "
        f"{time.monotonic() - started:.1f}s"
    )
    expected = expected_events(landing)
    log(f"{len(batches)} batches, {sum(b.events for b in batches):,} events landed")
    kinds = {kill.kind for kill in chaos.kills}
    assert len(chaos.kills) >= 10 and kinds == {"worker", "driver", "postgres"}

    verdict = verify(work / "data" / "warehouse" / f"enriched_{source}", db_url, source, expected)
    print(verdict.line(mode), flush=True)
    assert verdict.splits == {"COMPLETED": verdict.splits.get("COMPLETED", -1)}
    assert verdict.missing == 0 and verdict.unexpected == 0
    assert verdict.wrong == 0
    assert verdict.dead_letters == verdict.malformed
    return verdict


def test_exactly_once_under_kills(postgres: tuple[OwnPostgres, Path]) -> None:
    verdict = _fault_run(postgres, "EXACTLY_ONCE", SEED)
    assert verdict.duplicates == 0


def test_at_least_once_under_kills(postgres: tuple[OwnPostgres, Path]) -> None:
    # Replays after a kill may duplicate (counted and printed); nothing may be lost.
    _fault_run(postgres, "AT_LEAST_ONCE", SEED + 1)
