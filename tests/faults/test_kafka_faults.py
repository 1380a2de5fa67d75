"""Exactly-once of the Kafka source under faults: every message a producer thread sent is in
the output once (duplicates 0, missing 0, extra 0), after SIGKILLed Spark workers and
drivers and crashed Postgres servers.

A Tansu broker (``tests/kafka_broker.py``) holds a 4-partition topic; a ``ClickProducer``
thread keeps producing clickstream events while repeated bounded `sluice run kafka_clicks`
(a `sluice discover` before each, as a schedule would do: each run reads what the partitions
held when it started) are killed at seeded moments — a Spark Python worker, the driver's
process group, Postgres (immediate stop, restart). Then the producer stops and fault-free
runs drain. The oracle is the producer's own record of what it sent, never Sluice's tables.
Every 5th batch is preceded by a message that is not JSON, timestamped in ``BAD_DAY``: each
is one dead letter, counted once, on that day (``partition_stats``), whatever the kills.
A watcher reads the consumer group's committed offsets all along: they never pass the
offsets Sluice committed in Postgres (the group is a copy for lag tools, written after each
checkpoint completes), and after the final run they equal them.

Runs go through the ``sluice`` CLI in subprocesses against a Postgres of the test's own.
The seed is printed; ``SLUICE_FAULTS_SEED=<n>`` replays a schedule.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, date, datetime
from datetime import time as dtime
from pathlib import Path

import psycopg
import pytest
from cdc_oracle import libpq_url
from fault_harness import REPO, Chaos, OwnPostgres, log, sluice, sluice_env, split_counts
from kafka_broker import ClickProducer, KafkaBroker, kafka_broker
from kafka_fault_pipelines import BOOTSTRAP_SETTING, TOPIC
from kafka_faults import GroupWatch, group_offsets, sluice_offsets
from kafka_pipeline import assert_exactly_once, output_rows
from kill_cases import (
    SEED,
    chaos_session,
    drain_stream,
    own_postgres,
    python_path,
    run_settings,
    stream_driver,
)

# `extended`: minutes each (`make faults` runs them, `make test` leaves them out).
pytestmark = [
    pytest.mark.faults,
    pytest.mark.extended,
    pytest.mark.spark,
    pytest.mark.timeout(1200),
]

MODULE = "tests.faults.kafka_fault_pipelines"
PIPELINE = "kafka_clicks"
PARTITIONS = 4
#: 6 kill points, every kind twice (the order shuffled by the seed).
PLAN = ["worker"] * 2 + ["driver"] * 2 + ["postgres"] * 2
#: Discoveries at most while kills are left (each opens the next bounded read).
MAX_TOP_UPS = 30
#: The Kafka timestamp of the malformed messages: the day their dead letters count on.
BAD_DAY = date(2026, 5, 2)


@pytest.fixture(scope="module")
def servers(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path, KafkaBroker]]:
    with own_postgres(request) as (server, root), kafka_broker() as broker:
        log(f"Tansu broker at {broker.bootstrap}")
        yield server, root, broker


def _env(work: Path, db_url: str, bootstrap: str) -> dict[str, str]:
    settings = {
        **run_settings(work, db_url, MODULE),
        BOOTSTRAP_SETTING: bootstrap,
        "PYTHONPATH": python_path(REPO / "tests"),
    }
    return sluice_env(settings, work)


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
    driver = stream_driver(chaos, env, work, server, db_url, PIPELINE, discover)
    # ~100 events a second over 4 partitions: a run on a loaded 2-core machine read ~170 a
    # second (Spark's start included), and each bounded run reads what the last one left.
    stamp = int(datetime.combine(BAD_DAY, dtime(12), tzinfo=UTC).timestamp() * 1000)
    producer = ClickProducer(
        broker.bootstrap, TOPIC, batch=40, pause=0.4, bad_every=5, bad_stamp=stamp
    )
    watch = GroupWatch(db_url, broker.bootstrap, PIPELINE, TOPIC, PARTITIONS)
    producer.start()
    time.sleep(2)  # something to read in the first run
    discover()
    watch.start()
    with chaos_session(driver, PIPELINE, [producer, watch]):
        driver.spend_budget()
        oracle = producer.stop()
        log(f"producer stopped: {len(oracle):,} events sent")
        # Until the output holds as many distinct events as were produced (checked exactly
        # below).
        drain_stream(
            driver,
            discover,
            lambda: (
                len({r["event_id"] for r in output_rows(output)}) >= len(oracle)
                and _dead_letters(db_url)[0] >= len(producer.bad)
            ),
        )
    assert len(chaos.kills) == len(PLAN)
    rows = output_rows(output)
    counts = Counter(r["event_id"] for r in rows)
    letters, keys, per_day = _dead_letters(db_url)
    print(
        f"RESULT {PIPELINE}: produced={len(oracle)} rows={len(rows)} "
        f"duplicates={sum(n - 1 for n in counts.values())} "
        f"missing={len(set(oracle) - set(counts))} extra={len(set(counts) - set(oracle))} "
        f"malformed={len(producer.bad)} dead_letters={letters} by_day={per_day} "
        f"splits={split_counts(db_url, PIPELINE)}",
        flush=True,
    )
    assert len(oracle) > 5_000
    assert_exactly_once(rows, oracle)
    assert len(producer.bad) > 10
    assert sorted(keys) == sorted(producer.bad), "dead letters != the malformed messages sent"
    assert per_day == {BAD_DAY: len(producer.bad)}, per_day
    _assert_group(watch, db_url, broker)


def _dead_letters(db_url: str) -> tuple[int, list[str], dict[date, int]]:
    """(dead letters, the message key each names, the days' dead-letter counts) of the
    pipeline, read from its tables."""
    with psycopg.connect(libpq_url(db_url)) as conn:
        reasons = [
            r[0]
            for r in conn.execute(
                "SELECT reason FROM sluice.dead_letters WHERE source = %s", (PIPELINE,)
            )
        ]
        per_day = dict(
            conn.execute(
                "SELECT partition_key, dead_letters FROM sluice.partition_stats"
                " WHERE source = %s AND dead_letters > 0",
                (PIPELINE,),
            ).fetchall()
        )
    keys = [reason.rsplit("(key '", 1)[-1].rstrip("')") for reason in reasons]
    return len(reasons), keys, per_day


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
