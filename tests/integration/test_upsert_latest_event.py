"""Every upsert sink keeps, per key, the row of the LATEST EVENT — whatever order records are
processed in: a late file with older events, two events of one key out of order in a file,
and a rebuild of an older day after a newer day was written (the rows of the older day are
processed again, after the newer ones).

One pipeline defined here (CSV accounts, event time ``at``, day-partitioned, upsert key
``account``) writes to each upsert sink in turn: Postgres, Iceberg, Delta. Each table is read
back with its own reader (SQL, PyIceberg's scan, delta-rs) and compared with an oracle
computed from the landed rows: one row per key, the one with the greatest ``at``.
Real Postgres, Spark, PyIceberg and delta-rs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from deltalake import DeltaTable

from enumerator_service import ConfigError
from enumerator_service._operations import Platform, discover, open_platform
from spark_jobs import DeltaSink, FileSource, IcebergSink, Pipeline, PostgresSink
from spark_jobs.connectors import sink_connector_named
from spark_jobs.connectors.iceberg._catalog import open_catalog
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

DAY1, DAY2 = date(2026, 3, 1), date(2026, 3, 2)
Row = tuple[int, str, datetime]


@pytest.fixture
def platform(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    settings: Settings = make_settings()
    platform = open_platform(settings)
    yield settings, platform
    platform.close()


def _at(day: date, hour: int, second: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC) + timedelta(seconds=second)


def _land(landing: Path, day: date, name: str, rows: list[Row]) -> None:
    folder = landing / f"dt={day.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["account,status,at", *(f"{a},{s},{t.isoformat()}" for a, s, t in rows)]
    (folder / name).write_text("\n".join(lines) + "\n")


def _oracle(landed: list[Row]) -> dict[int, str]:
    """Per account, the status of its latest event (no two events of an account share a
    time here, so the order of processing cannot matter)."""
    latest: dict[int, Row] = {}
    for row in landed:
        if row[0] not in latest or row[2] > latest[row[0]][2]:
            latest[row[0]] = row
    return {account: status for account, (_, status, _) in latest.items()}


def _sink(kind: str, settings: Settings, tmp_path: Path) -> Any:
    name = f"{settings.source_name}_accounts"
    if kind == "postgres":
        return PostgresSink(f"public.{name}", upsert_key=["account"])
    if kind == "iceberg":
        return IcebergSink(f"{settings.source_name}.accounts", upsert_key=["account"])
    return DeltaSink(tmp_path / "lake" / name, upsert_key=["account"])


def _reader(kind: str, sink: Any, plat: Platform) -> Callable[[], list[tuple[int, str]]]:
    def postgres() -> list[tuple[int, str]]:
        with plat.engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT account, status FROM {sink.table}")).all()
        return [(int(a), str(s)) for a, s in rows]

    def iceberg() -> list[tuple[int, str]]:
        table = open_catalog(plat.engine, None, None).load_table(sink.table)
        rows = table.scan(selected_fields=("account", "status")).to_arrow().to_pylist()
        return [(r["account"], r["status"]) for r in rows]

    def delta() -> list[tuple[int, str]]:
        rows = DeltaTable(str(sink.path)).to_pyarrow_table(columns=["account", "status"])
        return [(r["account"], r["status"]) for r in rows.to_pylist()]

    return {"postgres": postgres, "iceberg": iceberg, "delta": delta}[kind]


def _assert_latest(read: Callable[[], list[tuple[int, str]]], landed: list[Row]) -> None:
    rows = read()
    accounts = [a for a, _ in rows]
    assert len(accounts) == len(set(accounts)), "a key is in the table twice"
    expected = _oracle(landed)
    wrong = {a: (s, expected.get(a)) for a, s in rows if expected.get(a) != s}
    assert not wrong and len(rows) == len(expected), f"(found, expected): {wrong}"


@pytest.mark.parametrize("kind", ["postgres", "iceberg", "delta"])
def test_the_latest_event_per_key_wins_in_any_processing_order(
    platform: tuple[Settings, Platform], tmp_path: Path, kind: str
) -> None:
    settings, plat = platform
    landing = tmp_path / "landing"
    sink = _sink(kind, settings, tmp_path)
    pipeline = Pipeline(
        name=settings.source_name,
        source=FileSource(
            schema={"account": "int64", "status": "string", "at": "timestamp"},
            required=["account", "at"],
            event_time="at",
            out_of_orderness="1h",  # (the out-of-order pair of b.csv is not late)
            landing=landing,
        ),
        sink=sink,
    )
    read = _reader(kind, sink, plat)

    def run(**options: Any) -> str:
        discover(plat, discovery_of(pipeline, settings))
        return run_pipeline(settings, pipeline, **options).run_id

    # Day 1: accounts 1-30 at noon; day 2: accounts 1-10 again, account 5 twice with its
    # later event first in the file.
    landed = [(a, "day1-noon", _at(DAY1, 12, a)) for a in range(1, 31)]
    _land(landing, DAY1, "a.csv", landed)
    day2 = [(a, "day2", _at(DAY2, 8, a)) for a in range(1, 11) if a != 5]
    day2 += [(5, "day2-later", _at(DAY2, 9)), (5, "day2-earlier", _at(DAY2, 8, 30))]
    _land(landing, DAY2, "b.csv", day2)
    landed += day2
    first = run()
    _assert_latest(read, landed)
    if kind != "postgres":
        # What the run wrote, as Dagster shows it: at most one row per key (41 staged rows
        # of 30 keys; MERGEs of several checkpoints may update a key again).
        shown = sink_connector_named(kind).output_metadata(pipeline, settings, first)
        assert len(_oracle(landed)) <= int(shown["rows_added"]) < len(landed)

    # A late file of day 1 with OLDER events of accounts 1-20 (and new accounts 31-35).
    late = [(a, "day1-dawn", _at(DAY1, 6, a)) for a in range(1, 21)]
    late += [(a, "day1-dawn", _at(DAY1, 6, a)) for a in range(31, 36)]
    _land(landing, DAY1, "c.csv", late)
    landed += late
    run()
    _assert_latest(read, landed)

    # Day 1 rebuilt: its rows are processed again, after day 2's.
    run(dates=[DAY1], rebuild=True)
    _assert_latest(read, landed)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_pipeline_writing_a_table_another_way_than_its_key_is_refused(
    platform: tuple[Settings, Platform], tmp_path: Path, kind: str
) -> None:
    """The first pipeline records its upsert key in the table (``sluice.upsert-key``); one
    that would append to that table, or upsert by another key, is refused before its run,
    and the table is untouched. (A Postgres table has its primary key for that.)"""
    settings, plat = platform
    landing = tmp_path / "landing"
    sink = _sink(kind, settings, tmp_path)
    source = FileSource(
        schema={"account": "int64", "status": "string", "at": "timestamp"},
        required=["account", "at"],
        event_time="at",
        landing=landing,
    )
    upserting = Pipeline(name=settings.source_name, source=source, sink=sink)
    _land(landing, DAY1, "a.csv", [(a, "first", _at(DAY1, 12, a)) for a in range(1, 6)])
    discover(plat, discovery_of(upserting, settings))
    run_pipeline(settings, upserting)
    read = _reader(kind, sink, plat)
    before = sorted(read())
    _land(landing, DAY1, "b.csv", [(a, "again", _at(DAY1, 13, a)) for a in range(1, 6)])
    for key in (None, ["status"]):
        other = dataclasses.replace(
            upserting,
            name=f"{settings.source_name}_x",
            sink=dataclasses.replace(sink, upsert_key=key),
        )
        discover(plat, discovery_of(other, settings))
        with pytest.raises(
            ConfigError, match=r"\(upsert_key\): table .* is upserted by \(account\)"
        ):
            run_pipeline(settings, other)
    assert sorted(read()) == before
