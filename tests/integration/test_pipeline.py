"""The first pipeline end to end: real Postgres, real local Spark, real files."""

from __future__ import annotations

import csv
import gzip
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_run, prepare_demo
from landing_oracle import expected_events

from enumerator_service import SplitStore, recover
from enumerator_service._operations import Platform, open_platform, platform_status
from enumerator_service._schema import dead_letters, sink_transactions
from spark_jobs.sink import SINKS

pytestmark = pytest.mark.spark


@pytest.fixture
def prepared(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    settings: Settings = make_settings()
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    yield settings, platform
    platform.close()


def _read_output(settings: Settings) -> list[dict[str, Any]]:
    dataset = ds.dataset(settings.output_path, format="parquet", partitioning="hive")
    return dataset.to_table().to_pylist()


def test_output_matches_a_direct_sql_join(prepared: tuple[Settings, Platform]) -> None:
    settings, platform = prepared
    found = demo_discover(platform)
    assert found.splits_registered == settings.demo_days * settings.demo_files_per_day

    summary = demo_run(settings)
    expected, malformed = expected_events(settings.landing_path)
    assert malformed > 0, "the sample data must contain malformed lines"
    assert (summary.rows_out, summary.dead_letters) == (len(expected), malformed)
    assert summary.splits == found.splits_registered and summary.fenced == 0

    # The oracle: load the well-formed events into Postgres and LEFT JOIN users there.
    with platform.engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TEMP TABLE expected (event_id text, user_id bigint, event_time timestamptz,"
                " event_type text, amount double precision)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO expected VALUES"
                " (:event_id, :user_id, :event_time, :event_type, :amount)"
            ),
            expected,
        )
        joined = conn.execute(
            sa.text(
                "SELECT e.event_id, e.user_id, e.event_time, e.event_type, e.amount, u.name,"
                " u.country, u.tier, u.signup_time FROM expected e"
                " LEFT JOIN public.users u ON u.id = e.user_id ORDER BY e.event_id"
            )
        ).all()
    rows = sorted(_read_output(settings), key=lambda r: r["event_id"])
    columns = [
        "event_id",
        "user_id",
        "event_time",
        "event_type",
        "amount",
        "user_name",
        "user_country",
        "user_tier",
        "user_signup_time",
    ]
    assert [tuple(r[c] for c in columns) for r in rows] == [tuple(j) for j in joined]
    assert any(r["user_name"] is None for r in rows), "unknown users must stay (left join)"
    assert {r["dt"] for r in rows} == {
        f"{settings.demo_start_date.replace(day=settings.demo_start_date.day + d)}"
        for d in range(settings.demo_days)
    }

    # Every malformed line is a dead letter with a reason; reruns add nothing.
    with platform.engine.connect() as conn:
        letters = conn.execute(
            sa.select(dead_letters.c.reason, dead_letters.c.raw).where(
                dead_letters.c.source == settings.source_name
            )
        ).all()
    assert len(letters) == malformed
    assert all(
        reason.split(":")[0]
        in {"invalid JSON", "invalid UTF-8", "missing field", "wrong type", "bad value"}
        for reason, _ in letters
    )
    again = demo_run(settings)
    assert again.nothing_new
    assert len(_read_output(settings)) == len(expected)
    status = platform_status(platform, settings.source_name)
    assert status.splits == {"COMPLETED": found.splits_registered}
    assert status.last_checkpoint is not None and status.last_checkpoint["status"] == "COMPLETED"


def test_backfill_of_one_date_processes_only_that_date(prepared: tuple[Settings, Platform]) -> None:
    settings, platform = prepared
    day = settings.demo_start_date
    demo_discover(platform)
    summary = demo_run(settings, dates=[day])
    assert summary.splits == settings.demo_files_per_day
    assert {r["dt"] for r in _read_output(settings)} == {day.isoformat()}
    rest = demo_run(settings)
    assert rest.splits == (settings.demo_days - 1) * settings.demo_files_per_day
    ids = [r["event_id"] for r in _read_output(settings)]
    assert len(ids) == len(set(ids))


def test_committed_but_unpublished_output_is_published_by_recovery(
    prepared: tuple[Settings, Platform],
) -> None:
    settings, platform = prepared
    demo_discover(platform)
    demo_run(settings)
    before = sorted(r["event_id"] for r in _read_output(settings))
    # Simulate a crash between the completion transaction and the publish step.
    with platform.engine.begin() as conn:
        txn = next(
            t
            for t in conn.execute(
                sa.select(sink_transactions).where(sink_transactions.c.row_count > 0)
            )
            if t.sink == "parquet" and t.staged[0]["final"].startswith(str(settings.output_path))
        )
        conn.execute(
            sa.update(sink_transactions)
            .where(sink_transactions.c.id == txn.id)
            .values(published=False)
        )
    for file in txn.staged:
        Path(file["staged"]).parent.mkdir(parents=True, exist_ok=True)
        Path(file["final"]).rename(file["staged"])
    assert len(_read_output(settings)) < len(before)
    assert recover(platform.engine, SINKS) == (1, 0)
    assert sorted(r["event_id"] for r in _read_output(settings)) == before
    assert recover(platform.engine, SINKS) == (0, 0)


def test_a_dead_run_returns_its_splits_and_the_next_run_takes_them(
    prepared: tuple[Settings, Platform],
) -> None:
    settings, platform = prepared
    demo_discover(platform)
    store = SplitStore(platform.engine)
    # A run that died holding leases: assigned, one split pulled, never committed.
    store.assign_to_run("run-dead", settings.source_name, lease_seconds=0.01)
    assert store.pull_next("run-dead", 0, 0.01) is not None
    time.sleep(0.1)  # leases are measured by the database clock
    summary = demo_run(settings)  # releases expired leases first
    expected, _ = expected_events(settings.landing_path)
    assert summary.rows_out == len(expected)
    ids = [r["event_id"] for r in _read_output(settings)]
    assert sorted(ids) == sorted(e["event_id"] for e in expected)


def test_byte_range_splits_produce_the_same_output(make_settings: Any) -> None:
    settings: Settings = make_settings(target_split_bytes=4096)
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        files = settings.demo_days * settings.demo_files_per_day
        found = demo_discover(platform)
        assert found.splits_registered > 4 * files  # every file was cut into byte ranges
        summary = demo_run(settings)
        expected, malformed = expected_events(settings.landing_path)
        assert (summary.rows_out, summary.dead_letters) == (len(expected), malformed)
        ids = sorted(r["event_id"] for r in _read_output(settings))
        assert ids == sorted(e["event_id"] for e in expected)
    finally:
        platform.close()


def test_every_landing_format_is_read_and_enriched(make_settings: Any) -> None:
    """JSON Lines, gzip JSON Lines, CSV, gzip CSV and Parquet side by side, one day."""
    settings: Settings = make_settings()
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform, events=False)
        folder = settings.landing_path / "dt=2026-01-05"
        folder.mkdir(parents=True)
        events = [
            {
                "event_id": f"e{i:04d}",
                "user_id": 1 + (i * 37) % settings.demo_users,
                "event_time": f"2026-01-05T00:{i % 60:02d}:00+00:00",
                "event_type": "order" if i % 3 == 0 else "click",
                "amount": round(i * 1.5, 2),
            }
            for i in range(500)
        ]
        chunks = [events[i::5] for i in range(5)]
        jsonl = b"".join(orjson.dumps(e) + b"\n" for e in chunks[0]) + b'{"broken\n'
        (folder / "a.jsonl").write_bytes(jsonl)
        (folder / "b.jsonl.gz").write_bytes(gzip.compress(jsonl.replace(b"e0", b"g0")))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(events[0]))
        writer.writeheader()
        writer.writerows(chunks[2])
        text.write("x,not-a-number,2026-01-05T00:00:00+00:00,click,1\n")
        (folder / "c.csv").write_text(text.getvalue())
        (folder / "d.csv.gz").write_bytes(
            gzip.compress(text.getvalue().replace("e0", "h0").encode())
        )
        table = pa.Table.from_pylist(chunks[4])
        pq.write_table(table, folder / "e.parquet", row_group_size=30)

        assert demo_discover(platform).splits_registered == 5
        summary = demo_run(settings)
        # a and b: 100 events + 1 bad line each; c and d: 100 rows + 1 bad row; e: 100 rows.
        assert (summary.splits, summary.rows_out, summary.dead_letters) == (5, 500, 4)
        rows = _read_output(settings)
        assert len({r["event_id"] for r in rows}) == 500
        assert all(r["user_name"] is not None for r in rows)
    finally:
        platform.close()
