"""Acceptance: a pipeline of the user's own, tried as a new user would, in all three modes.

This module is the user's pipeline module: it defines ``shipments`` at its top level — CSV
shipments (decimal, date, bool, timestamp fields; an optional field; a column it does not
declare) enriched from ``logistics.warehouses`` on the composite key (region, warehouse
code), a Map that prices them and a Filter that keeps the shipments of active warehouses
with a weight, written as Parquet by day with a declared key. Nothing of it is the demo's:
other names, other types, a table the test creates with columns of its own. Sluice ships the
module's Map function to the Spark workers by value (``spark_jobs.jobs._shipping``).

It is registered with ``SLUICE_PIPELINES`` and run through Dagster in the three modes, each
after new files landed, and after each the whole output is compared with an independent
oracle: the landing files parsed with the standard library (``csv``, ``decimal``,
``datetime``, following the documented conversion rules), loaded into Postgres and joined
with the warehouses table in SQL there.

(a) ``materialize()`` of two days in one run (a single-run backfill) — output == oracle,
    every check passes on both days;
(b) a schedule tick (``build_schedule_context`` on ``shipments_schedule``, the requested
    ``shipments_incremental`` job executed) after files landed on a processed day and a new
    one — output == oracle, nothing twice; a second tick finds nothing new;
(c) the continuous sensor ticks (requesting ``shipments_continuous``, then feeding the live
    run a file that lands while it runs) and the requested job runs until it idles out —
    output == oracle, exactly once (no duplicate key, no missing row).

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import csv
import io
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings, load_test_settings
from dagster import (
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    ExecuteInProcessResult,
    RunRequest,
    RunsFilter,
    SkipReason,
    build_schedule_context,
    materialize,
)
from dagster_support import sensor_named, sensor_tick, split_counts, step_output
from sluice_resource import resource_for

from dagster_project import PipelineDefinitions, pipeline_definitions
from dagster_project.continuous import SLUICE_RUN_TAG
from dagster_project.definitions import local_resources, pipelines_definitions
from enumerator_service import Settings, connect_engine
from enumerator_service._operations import open_platform
from spark_jobs import FileSource, Filter, Lookup, Map, ParquetSink, PartialCache, Pipeline
from spark_jobs.connectors.files import landing_path
from spark_jobs.connectors.parquet import output_path

pytestmark = pytest.mark.spark

# =========================================================================== the user's module

#: Price per kilogram, on top of the warehouse's handling fee.
PER_KG = Decimal("1.25")
HEAVY_KG = Decimal("100.000")


def price(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``charge``: handling fee + weight x 1.25, rounded to cents (half away from zero);
    ``heavy``: at least 100 kg."""
    weight = batch.column("weight_kg")
    per_kg = pc.multiply(weight, pa.scalar(PER_KG, pa.decimal128(3, 2)))
    charge = pc.round(
        pc.add(batch.column("handling_fee"), per_kg), ndigits=2, round_mode="half_towards_infinity"
    )
    heavy = pc.greater_equal(weight, pa.scalar(HEAVY_KG, pa.decimal128(9, 3)))
    return batch.append_column("charge", charge.cast(pa.decimal128(12, 2))).append_column(
        "heavy", heavy
    )


shipments = Pipeline(
    name="shipments",
    description="Shipments with their warehouse and their charge, by day.",
    source=FileSource(
        schema={
            "shipment_id": "string",
            "region": "string",
            "warehouse_code": "int32",
            "weight_kg": "decimal(9,3)",
            "declared_value": "decimal(12,2)",
            "ship_date": "date",
            "express": "bool",
            "shipped_at": "timestamp",
        },
        required=["shipment_id", "region", "warehouse_code", "weight_kg", "shipped_at"],
        event_time="shipped_at",
        partition_by="day",
        start_date="2026-03-01",
    ),
    steps=[
        Lookup(
            "logistics.warehouses",
            on={"region": "region", "warehouse_code": "code"},
            columns={
                "name": "warehouse_name",
                "handling_fee": "handling_fee",
                "opened_on": "warehouse_opened",
                "active": "warehouse_active",
            },
            on_miss="dead_letter",
            cache=PartialCache(max_rows=64),
        ),
        Map(price, output={"charge": "decimal(12,2)", "heavy": "bool"}),
        Filter(
            pc.field("warehouse_active")
            & (pc.field("weight_kg") > pa.scalar(Decimal("0.000"), pa.decimal128(9, 3)))
        ),
    ],
    sink=ParquetSink("shipments_by_day"),
    key=["shipment_id"],
)

# =========================================================================== the test's data

REGIONS = ("north", "south", "east", "west")
#: Codes 1-5 exist in every region; 6 does not (a dead letter at the lookup).
CODES = range(1, 6)
UNKNOWN_CODE = 6
INACTIVE = {("east", 2), ("west", 5)}
HEADER = [
    "shipped_at",
    "shipment_id",
    "notes",  # not declared: ignored
    "region",
    "warehouse_code",
    "weight_kg",
    "declared_value",
    "express",
    "ship_date",
]
ROWS_PER_FILE = 120
D1, D2, D3, D4 = (date(2026, 3, day) for day in (1, 2, 3, 4))
COLUMNS = [
    "shipment_id",
    "region",
    "warehouse_code",
    "weight_kg",
    "declared_value",
    "ship_date",
    "express",
    "shipped_at",
    "warehouse_name",
    "handling_fee",
    "warehouse_opened",
    "warehouse_active",
    "charge",
    "heavy",
    "dt",
]


def _malformed(kind: int, row: dict[str, str]) -> list[str]:
    """A row the pipeline must dead-letter (one kind of mistake each)."""
    bad = dict(row)
    if kind == 0:
        bad["shipment_id"] = ""  # a required field missing
    elif kind == 1:
        bad["weight_kg"] = "12.3456"  # more decimals than decimal(9,3)
    elif kind == 2:
        bad["express"] = "maybe"
    elif kind == 3:
        bad["ship_date"] = "2026-02-30"
    elif kind == 4:
        bad["warehouse_code"] = "x7"
    else:
        return [bad[name] for name in HEADER][:5]  # too few fields
    return [bad[name] for name in HEADER]


def write_shipments(landing: Path, day: date, name: str, seed: int) -> Path:
    """One CSV file of ``ROWS_PER_FILE`` shipments of ``day``, times ascending; written under a
    hidden name and renamed, as a careful producer does."""
    rng = random.Random(seed)
    folder = landing / f"dt={day.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    for i in range(ROWS_PER_FILE):
        when = start + timedelta(seconds=i * 600 + rng.randrange(600))
        weight = Decimal(0 if i % 23 == 4 else rng.randrange(1, 250_000)) / 1000
        row = {
            "shipped_at": when.isoformat() if i % 3 else when.strftime("%Y-%m-%dT%H:%M:%S"),
            "shipment_id": f"sh-{name}-{i:04d}",
            "notes": rng.choice(["", "fragile", "keep dry, 'this' side up"]),
            "region": rng.choice(REGIONS),
            "warehouse_code": str(UNKNOWN_CODE if i % 60 == 5 else rng.choice(CODES)),
            "weight_kg": f"{weight:.3f}" if i % 7 else str(weight.normalize()),
            "declared_value": "" if i % 9 == 0 else f"{rng.randrange(1, 10**7) / 100:.2f}",
            "express": rng.choice(["true", "false", "1", "0", "TRUE", " False ", ""]),
            "ship_date": ""
            if i % 11 == 0
            else (day - timedelta(days=rng.randrange(3))).isoformat(),
        }
        if i % 60 == 37:
            writer.writerow(_malformed(rng.randrange(6), row))
        else:
            writer.writerow([row[name] for name in HEADER])
    tmp = folder / f".{name}.csv.tmp"
    tmp.write_text(out.getvalue())
    path = folder / f"{name}.csv"
    os.replace(tmp, path)
    return path


def create_warehouses(engine: sa.Engine) -> None:
    rng = random.Random(11)
    rows = [
        {
            "region": region,
            "code": code,
            "name": f"{region.title()} #{code}",
            "fee": Decimal(rng.randrange(50, 2000)) / 100,
            "opened": date(2020, 1, 1) + timedelta(days=rng.randrange(2000)),
            "active": (region, code) not in INACTIVE,
        }
        for region in REGIONS
        for code in range(1, 6)
    ]
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA IF NOT EXISTS logistics"))
        conn.execute(sa.text("DROP TABLE IF EXISTS logistics.warehouses"))
        conn.execute(
            sa.text(
                "CREATE TABLE logistics.warehouses (region text, code integer, "
                "name text NOT NULL, handling_fee numeric(8,2) NOT NULL, "
                "opened_on date NOT NULL, active boolean NOT NULL, PRIMARY KEY (region, code))"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO logistics.warehouses VALUES "
                "(:region, :code, :name, :fee, :opened, :active)"
            ),
            rows,
        )


# =========================================================================== the oracle


def _decimal(text: str, precision: int, scale: int) -> Decimal:
    number = Decimal(text)  # InvalidOperation when not a number
    if not number.is_finite() or number != number.quantize(Decimal(1).scaleb(-scale)):
        raise ValueError(text)
    if abs(number) >= Decimal(10) ** (precision - scale):
        raise ValueError(text)
    return number


def _parse(row: dict[str, str]) -> dict[str, Any]:
    """One CSV row as the documented conversion rules read it; ValueError when it is not
    well-formed (a dead letter)."""
    for name in ("shipment_id", "region", "warehouse_code", "weight_kg", "shipped_at"):
        if row[name] == "":
            raise ValueError(f"missing {name}")
    code = row["warehouse_code"].strip()
    if not re.fullmatch(r"[+-]?[0-9]+", code) or not -(2**31) <= int(code) < 2**31:
        raise ValueError(code)
    when = datetime.fromisoformat(row["shipped_at"])
    express = row["express"].strip().lower()
    if express not in {"", "true", "false", "1", "0"}:
        raise ValueError(express)
    return {
        "shipment_id": row["shipment_id"],
        "region": row["region"],
        "warehouse_code": int(code),
        "weight_kg": _decimal(row["weight_kg"], 9, 3),
        "declared_value": _decimal(row["declared_value"], 12, 2) if row["declared_value"] else None,
        "ship_date": date.fromisoformat(row["ship_date"]) if row["ship_date"] else None,
        "express": None if express == "" else express in {"true", "1"},
        "shipped_at": (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC),
    }


def landed_records(landing: Path) -> tuple[list[dict[str, Any]], int]:
    """(well-formed records with their ``dt``, malformed rows) of every landed CSV file."""
    good: list[dict[str, Any]] = []
    bad = 0
    for path in sorted(landing.glob("dt=*/*.csv")):
        with path.open(newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader)
            for fields in reader:
                try:
                    if len(fields) != len(header):
                        raise ValueError("field count")
                    record = _parse(dict(zip(header, fields, strict=True)))
                except (ValueError, InvalidOperation):
                    bad += 1
                    continue
                good.append({**record, "dt": path.parent.name.removeprefix("dt=")})
    return good, bad


_ORACLE = """
SELECT s.shipment_id, s.region, s.warehouse_code, s.weight_kg, s.declared_value, s.ship_date,
       s.express, s.shipped_at, w.name, w.handling_fee, w.opened_on, w.active,
       round(w.handling_fee + s.weight_kg * 1.25, 2), s.weight_kg >= 100, s.dt
FROM landed AS s
JOIN logistics.warehouses AS w ON (w.region, w.code) = (s.region, s.warehouse_code)
WHERE w.active AND s.weight_kg > 0
"""


@dataclass(frozen=True)
class Oracle:
    """What the output must be: rows by key, and how many records are dead letters and how
    many the Filter removes."""

    rows: dict[str, tuple[Any, ...]]
    dead_letters: int
    removed: int

    @property
    def days(self) -> set[str]:
        return {row[-1] for row in self.rows.values()}


def oracle(settings: Settings) -> Oracle:
    records, malformed = landed_records(landing_path(shipments, settings))
    assert settings.database_url is not None
    engine = connect_engine(settings.database_url.get_secret_value(), pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "CREATE TEMP TABLE landed (shipment_id text, region text, "
                    "warehouse_code integer, weight_kg numeric(9,3), declared_value "
                    "numeric(12,2), ship_date date, express boolean, shipped_at timestamptz, "
                    "dt text) ON COMMIT DROP"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO landed VALUES (:shipment_id, :region, :warehouse_code, "
                    ":weight_kg, :declared_value, :ship_date, :express, :shipped_at, :dt)"
                ),
                records,
            )
            joined = conn.execute(sa.text(_ORACLE)).all()
            matched = conn.execute(
                sa.text(
                    "SELECT count(*) FROM landed AS s JOIN logistics.warehouses AS w "
                    "ON (w.region, w.code) = (s.region, s.warehouse_code)"
                )
            ).scalar_one()
    finally:
        engine.dispose()
    rows = {row[0]: _normal(tuple(row)) for row in joined}
    assert len(rows) == len(joined), "the generator's keys are unique"
    misses = len(records) - matched
    return Oracle(rows, malformed + misses, matched - len(rows))


def _normal(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """Timestamps in UTC (Postgres returns them in the session's zone); the rest as is."""
    return tuple(v.astimezone(UTC) if isinstance(v, datetime) else v for v in row)


def output_rows(settings: Settings) -> list[tuple[Any, ...]]:
    """Every row of the output table (all ``dt=`` folders), in ``COLUMNS`` order."""
    folder = output_path(shipments, settings)
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    return [_normal(tuple(str(r[c]) if c == "dt" else r[c] for c in COLUMNS)) for r in rows]


def assert_output_is_the_oracle(settings: Settings) -> Oracle:
    """Output == oracle: each expected row exactly once, nothing else."""
    expected = oracle(settings)
    rows = output_rows(settings)
    keys = [row[0] for row in rows]
    assert len(keys) == len(set(keys)), "a key appears twice in the output"
    missing = expected.rows.keys() - set(keys)
    extra = set(keys) - expected.rows.keys()
    assert not missing and not extra, f"missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}"
    different = [row for row in rows if expected.rows[row[0]] != row]
    assert not different, f"{len(different)} rows differ, e.g. {different[0]} != " + str(
        expected.rows[different[0][0]]
    )
    return expected


# =========================================================================== the platform


@dataclass(frozen=True)
class Platform:
    settings: TestSettings
    built: PipelineDefinitions
    instance: DagsterInstance

    @property
    def landing(self) -> Path:
        return landing_path(shipments, self.settings)

    def checks(self, first: date, last: date) -> dict[tuple[str, str | None], bool]:
        """Every check of every day in ``first..last``, launched on their own (as from the
        UI): passed, by (check, day)."""
        result = materialize(
            [self.built.output, *self.built.checks],
            selection=AssetSelection.checks_for_assets(self.built.output),
            tags={
                "dagster/asset_partition_range_start": first.isoformat(),
                "dagster/asset_partition_range_end": last.isoformat(),
            },
            resources={"sluice": resource_for(self.settings)},
            instance=self.instance,
        )
        assert result.success
        return {(e.check_name, e.partition): e.passed for e in result.get_asset_check_evaluations()}


CHECKS = {"unique_key", "rows_reconcile", "dead_letter_ratio", "no_quarantined_splits"}


@pytest.fixture(scope="module")
def platform(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    root = tmp_path_factory.mktemp("user_pipeline")
    settings = load_test_settings(
        database_url=db_url,
        home=root / "home",
        data_dir=root / "data",
        source_name=shipments.name,
        spark_master="local[2]",
        parallelism=2,
    )
    opened = open_platform(settings)  # migrations
    try:
        create_warehouses(opened.engine)
    finally:
        opened.close()
    (root / "dagster").mkdir()
    with DagsterInstance.local_temp(str(root / "dagster")) as instance:
        yield Platform(settings, pipeline_definitions(shipments, settings), instance)


# Dagster 1.13 itself passes ``owners=[]`` when it binds resources to a sensor's job.
@pytest.mark.filterwarnings(
    "ignore:Parameter `owners` of initializer `SensorDefinition.__init__`:"
    "dagster_shared.utils.warnings.BetaWarning"
)
def test_the_module_registers_its_pipeline(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SLUICE_PIPELINES=<this module>``: the code location holds the pipeline's asset, its
    inputs (the landing folder, the warehouses table), checks, jobs, sensors, schedule."""
    monkeypatch.setenv("SLUICE_PIPELINES", __name__)
    monkeypatch.setenv("SLUICE_DAGSTER_PARTITIONS", "daily")  # the partitions from start_date
    monkeypatch.setenv("SLUICE_DATA_DIR", str(platform.settings.data_dir))
    defs = pipelines_definitions(local_resources())
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get_all_asset_keys()} == {
        "shipments",
        "shipments_landing",
        "logistics/warehouses",
    }
    output = defs.resolve_assets_def("shipments")
    assert output.partitions_def is not None
    assert output.partitions_def.get_first_partition_key() == "2026-03-01"
    assert {key.name for key in graph.asset_check_keys} == {*CHECKS, "watermark_freshness"}
    assert defs.resolve_schedule_def("shipments_schedule").job_name == "shipments_incremental"
    assert defs.resolve_sensor_def("shipments_continuous").job_name == "shipments_continuous"
    assert defs.resolve_sensor_def("shipments_new_files").job_name == "shipments_incremental"
    # The plan Sluice derived from the definition: the output the oracle is compared with.
    assert [column.name for column in shipments.output] == COLUMNS[:-1]


# --------------------------------------------------------------------------- (a) backfill


@pytest.fixture(scope="module")
def backfilled(platform: Platform) -> ExecuteInProcessResult:
    for day in (D1, D2):
        for part in range(2):
            write_shipments(platform.landing, day, f"a-{day:%d}-{part}", seed=day.day * 10 + part)
    return materialize(
        [platform.built.output, *platform.built.checks],
        tags={
            "dagster/asset_partition_range_start": D1.isoformat(),
            "dagster/asset_partition_range_end": D2.isoformat(),
        },
        resources={"sluice": resource_for(platform.settings)},
        instance=platform.instance,
    )


def test_a_backfill_of_two_days_is_the_oracle(
    platform: Platform, backfilled: ExecuteInProcessResult
) -> None:
    assert backfilled.success
    events = backfilled.asset_materializations_for_node("shipments")
    assert sorted(e.partition or "" for e in events) == [D1.isoformat(), D2.isoformat()]
    metadata = {key: value.value for key, value in events[0].metadata.items()}
    assert metadata["splits"] == 4  # one run over both days' four files

    expected = assert_output_is_the_oracle(platform.settings)
    assert expected.days == {D1.isoformat(), D2.isoformat()}
    assert metadata["rows_out"] == len(expected.rows)
    assert metadata["dead_letters"] == expected.dead_letters > 0
    assert metadata["rows_removed_by_steps"] == expected.removed > 0
    assert any(row[COLUMNS.index("heavy")] for row in expected.rows.values())
    assert any(row[COLUMNS.index("declared_value")] is None for row in expected.rows.values())

    checks = {
        (e.check_name, e.partition): e.passed for e in backfilled.get_asset_check_evaluations()
    }
    assert checks == {(name, day.isoformat()): True for name in CHECKS for day in (D1, D2)}


# --------------------------------------------------------------------------- (b) schedule


def _schedule_run(platform: Platform, hour: int) -> dict[str, Any]:
    """One tick of the pipeline's schedule, and the run it requests, executed."""
    (schedule,) = platform.built.schedules
    assert schedule.name == "shipments_schedule"
    when = datetime(2026, 3, 5, hour, tzinfo=UTC)
    data = schedule.evaluate_tick(build_schedule_context(scheduled_execution_time=when))
    (request,) = data.run_requests or []
    assert isinstance(request, RunRequest)
    job = platform.built.incremental_job
    assert schedule.job_name == job.name
    result = job.execute_in_process(
        run_config=request.run_config,
        tags=request.tags,
        resources={"sluice": resource_for(platform.settings)},
        instance=platform.instance,
    )
    assert result.success
    return step_output(result)


@pytest.fixture(scope="module")
def scheduled(platform: Platform, backfilled: ExecuteInProcessResult) -> list[dict[str, Any]]:
    assert backfilled.success
    # A late file of a day the backfill processed, and a new day.
    write_shipments(platform.landing, D2, "b-02-late", seed=201)
    for part in range(2):
        write_shipments(platform.landing, D3, f"b-03-{part}", seed=300 + part)
    return [_schedule_run(platform, 1), _schedule_run(platform, 2)]


def test_a_schedule_tick_after_new_files_is_the_oracle(
    platform: Platform, scheduled: list[dict[str, Any]]
) -> None:
    first, second = scheduled
    # Only the new files: the backfill's splits are neither registered nor read again.
    assert (first["splits_registered"], first["splits"]) == (3, 3)
    expected = assert_output_is_the_oracle(platform.settings)
    assert expected.days == {D1.isoformat(), D2.isoformat(), D3.isoformat()}
    assert second["nothing_new"] is True and second["splits_registered"] == 0
    assert split_counts(platform.settings, shipments.name) == {"COMPLETED": 7}
    assert platform.checks(D1, D3) == {
        (name, day.isoformat()): True for name in CHECKS for day in (D1, D2, D3)
    }


# --------------------------------------------------------------------------- (c) continuous


@dataclass(frozen=True)
class ContinuousOutcome:
    request: RunRequest
    fed: SkipReason
    result: ExecuteInProcessResult
    after: Any


@pytest.fixture(scope="module")
def continuous(platform: Platform, scheduled: list[dict[str, Any]]) -> Iterator[ContinuousOutcome]:
    sensor = sensor_named(platform.built, "continuous")
    sluice = resource_for(platform.settings)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_CHECKPOINT_INTERVAL_SECONDS", "0.5")
        env.setenv("SLUICE_CONTINUOUS_POLL_SECONDS", "0.2")
        env.setenv("SLUICE_CONTINUOUS_IDLE_SECONDS", "5")
        write_shipments(platform.landing, D3, "c-03-late", seed=310)
        write_shipments(platform.landing, D4, "c-04-0", seed=400)
        request, cursor = sensor_tick(sensor, sluice, None, platform.instance)
        assert isinstance(request, RunRequest), request
        fed: dict[str, Any] = {}

        def feed() -> None:
            """While the run is live: a file lands, the next tick assigns it to the run."""
            try:
                mine = RunsFilter(tags={SLUICE_RUN_TAG: request.tags[SLUICE_RUN_TAG]})
                _wait(
                    lambda: (
                        any(
                            run.status == DagsterRunStatus.STARTED
                            for run in platform.instance.get_runs(mine)
                        )
                        and split_counts(platform.settings, shipments.name).get("COMPLETED", 0) > 7
                    )
                )
                write_shipments(platform.landing, D4, "c-04-1", seed=401)
                fed["tick"], fed["cursor"] = sensor_tick(sensor, sluice, cursor, platform.instance)
            except BaseException as exc:  # shown by the test
                fed["error"] = exc

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            result = platform.built.continuous_job.execute_in_process(
                tags=request.tags, resources={"sluice": sluice}, instance=platform.instance
            )
        finally:
            feeder.join(timeout=180)
        assert "error" not in fed, fed["error"]
        after, _ = sensor_tick(sensor, sluice, fed["cursor"], platform.instance)
        yield ContinuousOutcome(request, fed["tick"], result, after)


def test_the_continuous_sensor_and_its_run_are_the_oracle_exactly_once(
    platform: Platform, continuous: ContinuousOutcome
) -> None:
    assert continuous.request.tags["sluice/splits_assigned"] == "2"
    assert isinstance(continuous.fed, SkipReason)
    assert "1 new splits; 1 assigned to the live continuous run" in (
        continuous.fed.skip_message or ""
    )
    assert continuous.result.success
    summary = step_output(continuous.result)
    assert summary["splits"] == 3  # the two files it was started with and the one fed to it

    expected = assert_output_is_the_oracle(platform.settings)
    assert expected.days == {day.isoformat() for day in (D1, D2, D3, D4)}
    assert split_counts(platform.settings, shipments.name) == {"COMPLETED": 10}
    # The run idled out; nothing new since: no next run.
    assert isinstance(continuous.after, SkipReason)
    assert (continuous.after.skip_message or "").startswith("no new input")
    assert platform.checks(D1, D4) == {
        (name, day.isoformat()): True for name in CHECKS for day in (D1, D2, D3, D4)
    }


def _wait(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)
