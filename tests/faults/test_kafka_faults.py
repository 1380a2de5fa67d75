"""Exactly-once of the Kafka source under faults: every message a producer thread sent is in
the output once (duplicates 0, missing 0, extra 0), after SIGKILLed Spark workers and
drivers and crashed Postgres servers.

A Tansu broker (``tests/kafka_broker.py``) holds a 4-partition topic; a ``ClickProducer``
thread keeps producing clickstream events while repeated bounded `sluice run kafka_clicks`
(a `sluice discover` before each, as a schedule would do: each run reads what the partitions
held when it started) are killed at seeded moments — a Spark Python worker, the driver's
process group, Postgres (immediate stop, restart). Then the producer stops and fault-free
runs drain. The oracle is the producer's own record of what it sent, never Sluice's tables.
A watcher reads the consumer group's committed offsets all along: they never pass the
offsets Sluice committed in Postgres (the group is a copy for lag tools, written after each
checkpoint completes), and after the final run they equal them.

Runs go through the ``sluice`` CLI in subprocesses against a Postgres of the test's own.
The seed is printed; ``SLUICE_FAULTS_SEED=<n>`` replays a schedule.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from cdc_oracle import libpq_url
from fault_harness import (
    REPO,
    Chaos,
    Driver,
    OwnPostgres,
    log,
    make_root,
    remove,
    sluice,
    sluice_env,
    split_counts,
)
from kafka_broker import ClickProducer, KafkaBroker, kafka_broker
from kafka_fault_pipelines import BOOTSTRAP_SETTING, TOPIC
from kafka_faults import GroupWatch, group_offsets, sluice_offsets
from kafka_pipeline import assert_exactly_once, output_rows

# `extended`: minutes each (`make faults` runs them, `make test` leaves them out).
pytestmark = [
    pytest.mark.faults,
    pytest.mark.extended,
    pytest.mark.spark,
    pytest.mark.timeout(1200),
]

SEED = int(os.environ.get("SLUICE_FAULTS_SEED", "20260101"))
MODULE = "tests.faults.kafka_fault_pipelines"
PIPELINE = "kafka_clicks"
PARTITIONS = 4
LEASE_SECONDS = 4.0
#: A run's Spark start on a machine shared with other test suites (load 30 on 2 cores seen).
SPARK_START = 400.0
KINDS = {"worker", "driver", "postgres"}
#: 6 kill points, every kind twice (the order shuffled by the seed).
PLAN = ["worker"] * 2 + ["driver"] * 2 + ["postgres"] * 2
#: Discoveries at most while kills are left (each opens the next bounded read).
MAX_TOP_UPS = 30
MAX_DRAIN_RUNS = 8


@pytest.fixture(scope="module")
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path, KafkaBroker]]:
    root = make_root()
    server = OwnPostgres(root)
    log(f"own Postgres in {root} ({server.url})")
    failed_before = request.session.testsfailed
    with kafka_broker() as broker:
        log(f"Tansu broker at {broker.bootstrap}")
        yield server, root, broker
    server.stop()
    if request.session.testsfailed > failed_before or os.environ.get("SLUICE_FAULTS_KEEP"):
        log(f"kept {root} (run logs under */logs, Postgres log in pg/log)")
    else:
        remove(root)


def _env(work: Path, db_url: str, bootstrap: str) -> dict[str, str]:
    paths = [str(REPO), str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return sluice_env(
        {
            "SLUICE_DATABASE_URL": db_url,
            "SLUICE_PIPELINES": MODULE,
            "SLUICE_HOME": str(work / "home"),
            "SLUICE_DATA_DIR": str(work / "data"),
            "SLUICE_SPARK_MASTER": "local[2]",
            "SLUICE_PARALLELISM": "2",
            "SLUICE_LEASE_SECONDS": str(LEASE_SECONDS),
            "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "1",
            "SLUICE_CHECKPOINT_TIMEOUT_SECONDS": "20",
            BOOTSTRAP_SETTING: bootstrap,
            "PYTHONPATH": os.pathsep.join(paths),
        },
        work,
    )


def test_kafka_exactly_once_under_kills(
    servers: tuple[OwnPostgres, Path, KafkaBroker],
) -> None:
    server, root, broker = servers
    work = root / PIPELINE
    work.mkdir()
    db_url = server.create_database(f"faults_{PIPELINE}")
    env = _env(work, db_url, broker.bootstrap)
    output = work / "data" / "warehouse" / PIPELINE
    broker.create_topic(TOPIC, PARTITIONS)
    sluice(env, work, "db", "upgrade")
    discoveries = 0

    def discover() -> bool:
        nonlocal discoveries
        discoveries += 1
        if discoveries > MAX_TOP_UPS:
            return False
        log(f"discover: {sluice(env, work, 'discover', PIPELINE).strip()}")
        return True

    seed = SEED + 2
    chaos = Chaos(seed, list(PLAN))
    log(f"seed {seed}")
    driver = Driver(chaos, env, work, server, db_url, PIPELINE, LEASE_SECONDS, top_up=discover)
    driver.start_timeout = driver.run_timeout = SPARK_START
    # ~100 events a second over 4 partitions: a run on a loaded 2-core machine read ~170 a
    # second (Spark's start included), and each bounded run reads what the last one left.
    producer = ClickProducer(broker.bootstrap, TOPIC, batch=40, pause=0.4)
    watch = GroupWatch(db_url, broker.bootstrap, PIPELINE, TOPIC, PARTITIONS)
    started = time.monotonic()
    producer.start()
    time.sleep(2)  # something to read in the first run
    discover()
    watch.start()
    try:
        driver.spend_budget()
        oracle = producer.stop()
        log(f"producer stopped: {len(oracle):,} events sent")
        _drain(driver, db_url, discover, output, len(oracle))
    finally:
        driver.close()
        if producer.is_alive():
            producer.stop()
        watch.stop()
        print(chaos.timeline(), flush=True)
    log(
        f"{PIPELINE}: {len(chaos.kills)} kills, {len(chaos.runs)} runs, "
        f"{time.monotonic() - started:.1f}s"
    )
    assert {kill.kind for kill in chaos.kills} == KINDS
    assert len(chaos.kills) == len(PLAN)
    rows = output_rows(output)
    counts = Counter(r["event_id"] for r in rows)
    print(
        f"RESULT {PIPELINE}: produced={len(oracle)} rows={len(rows)} "
        f"duplicates={sum(n - 1 for n in counts.values())} "
        f"missing={len(set(oracle) - set(counts))} extra={len(set(counts) - set(oracle))} "
        f"splits={split_counts(db_url, PIPELINE)}",
        flush=True,
    )
    assert len(oracle) > 5_000
    assert_exactly_once(rows, oracle)
    _assert_group(watch, db_url, broker)


def _drain(
    driver: Driver, db_url: str, discover: Callable[[], bool], output: Path, produced: int
) -> None:
    """Discover and run (no faults) until every split is COMPLETED and the output holds as
    many distinct events as were produced (checked exactly by the caller)."""
    for _ in range(MAX_DRAIN_RUNS):
        discover()
        record = driver.finish_run(driver.start_run(), [])
        counts = split_counts(db_url, PIPELINE)
        done = set(counts) == {"COMPLETED"}
        if done and len({r["event_id"] for r in output_rows(output)}) >= produced:
            return
        if record.returncode not in (0, 3) or not done:
            time.sleep(LEASE_SECONDS + 1)  # a dead run's leases expire
    raise AssertionError(
        f"not drained after {MAX_DRAIN_RUNS} runs: {split_counts(db_url, PIPELINE)}"
    )


def _assert_group(watch: GroupWatch, db_url: str, broker: KafkaBroker) -> None:
    """The group never passed Sluice's committed offsets; after the final run it holds them."""
    assert watch.error is None, watch.error
    log(
        f"group watch: {len(watch.samples)} samples, {len(watch.violations)} past Sluice's "
        f"committed offsets, {watch.down} times Postgres down"
    )
    assert len(watch.samples) > 10
    assert watch.violations == [], [v.past() for v in watch.violations[:5]]
    group = group_offsets(broker.bootstrap, f"sluice-{PIPELINE}", TOPIC, PARTITIONS)
    with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
        ours = sluice_offsets(conn, PIPELINE, TOPIC)
    log(f"after the final run: group {group}, Sluice {ours}")
    assert group == ours
