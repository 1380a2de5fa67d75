"""The Delta sink end to end (real Postgres, real local Spark, real delta-rs): the clickstream
demo written to a Delta table, read back by delta-rs and by Polars over the log's current
data files, against the landing oracle; one Delta commit per completed checkpoint carrying
the run's app transaction; a rebuild of one day in one overwrite commit; bad tables refused
with one line before a run starts."""

from __future__ import annotations

import csv
import dataclasses
from collections import Counter
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from deltalake import DeltaTable
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from landing_oracle import expected_events

from enumerator_service import ConfigError, asyncpg_dsn
from enumerator_service._operations import discover, open_platform
from enumerator_service._schema import checkpoints, sink_transactions
from examples.orders import orders
from spark_jobs import DeltaSink, FileSource, Filter, Pipeline, SampleTarget
from spark_jobs.connectors.delta import rebuild_app_id, run_app_id
from spark_jobs.connectors.files import landing_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark


def _pipeline(settings: Settings, table: Path, **sink: Any) -> Pipeline:
    return dataclasses.replace(demo_pipeline(settings), sink=DeltaSink(str(table), **sink))


def _ids(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(str(row["event_id"]) for row in rows)


def _check_exact(table: Path, oracle: list[dict[str, Any]]) -> None:
    """delta-rs and Polars (the log's current files) both hold the oracle's events exactly."""
    delta = DeltaTable(str(table))
    rows = delta.to_pyarrow_table().to_pylist()
    files = delta.file_uris()
    polars_rows = pl.read_parquet(files).to_dicts() if files else []
    wanted = _ids(oracle)
    for got in (_ids(rows), _ids(polars_rows)):
        assert sum((got - wanted).values()) == 0  # duplicates (or strangers)
        assert sum((wanted - got).values()) == 0  # missing
    for row in rows:  # the partition column is the record's output day (UTC event day)
        assert row["dt"] == row["event_time"].date()


def _completed_with_files(settings: Settings, run_id: str) -> list[int]:
    platform = open_platform(settings)
    try:
        with platform.engine.connect() as conn:
            done = set(
                conn.execute(
                    sa.select(checkpoints.c.checkpoint_id).where(
                        checkpoints.c.run_id == run_id, checkpoints.c.status == "COMPLETED"
                    )
                ).scalars()
            )
            staged = conn.execute(
                sa.select(sink_transactions.c.checkpoint_id, sink_transactions.c.staged).where(
                    sink_transactions.c.run_id == run_id, sink_transactions.c.committed
                )
            ).all()
    finally:
        platform.close()
    with_files = {cp for cp, files in staged if files}
    assert with_files <= done
    return sorted(with_files)


def test_the_demo_into_a_delta_table_exactly_once_then_a_day_rebuilt(
    make_settings: Any, tmp_path: Path
) -> None:
    settings: Settings = make_settings(demo_events=300, demo_days=2, demo_files_per_day=2)
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    platform.close()
    table = tmp_path / "lake" / "events"
    pipeline = _pipeline(settings, table)
    oracle, _bad = expected_events(Path(settings.landing_path))

    summary = run_pipeline(settings, pipeline, run_id="delta-run-1")
    assert summary.run_id == "delta-run-1"
    _check_exact(table, oracle)
    # One Delta commit per completed checkpoint with output, app transaction = last of them.
    delta = DeltaTable(str(table))
    commits = [h for h in delta.history() if h["operation"] == "WRITE"]
    with_files = _completed_with_files(settings, "delta-run-1")
    assert len(commits) == len(with_files) >= 1
    app = run_app_id(settings.source_name, "delta-run-1")
    assert delta.transaction_version(app) == max(with_files)

    # A rebuild of day 1: one overwrite commit, day 2's files untouched, rows exact again.
    day1 = settings.demo_start_date
    before = pa.table(delta.get_add_actions(flatten=True)).to_pylist()
    other = sorted(a["path"] for a in before if a["partition.dt"] != day1)
    version = delta.version()
    run_pipeline(settings, pipeline, dates=[day1], rebuild=True, run_id="delta-rebuild")
    delta = DeltaTable(str(table))
    assert delta.version() == version + 1
    assert delta.history(1)[0]["operationParameters"]["mode"] == "Overwrite"
    assert delta.transaction_version(rebuild_app_id(settings.source_name, day1.isoformat()))
    after = pa.table(delta.get_add_actions(flatten=True)).to_pylist()
    assert sorted(a["path"] for a in after if a["partition.dt"] != day1) == other
    day1_files = [a["path"] for a in after if a["partition.dt"] == day1]
    assert day1_files and all(p.startswith(f"dt={day1}/rebuild-") for p in day1_files)
    # The swapped-out generation is VACUUM's to remove (none of it in a `_` folder).
    removed = {a["path"] for a in before if a["partition.dt"] == day1}
    vacuumable = delta.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True)
    assert removed and removed <= set(vacuumable)
    assert not set(vacuumable) & {a["path"] for a in after}
    _check_exact(table, oracle)


def test_bad_tables_are_refused_with_one_line_before_the_run(
    make_settings: Any, tmp_path: Path
) -> None:
    settings: Settings = make_settings(demo_events=20, demo_days=1, demo_files_per_day=1)
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    platform.close()
    wrong_type = tmp_path / "wrong_type"
    DeltaTable.create(
        str(wrong_type),
        pa.schema([("event_id", pa.int64()), ("dt", pa.date32())]),
        partition_by=["dt"],
    )
    unpartitioned = tmp_path / "unpartitioned"
    DeltaTable.create(str(unpartitioned), pa.schema([("event_id", pa.string())]))
    for table, problem in (
        (wrong_type, "event_id is long in the table, string in the output"),
        (unpartitioned, "is partitioned by nothing, the pipeline needs dt"),
    ):
        with pytest.raises(ConfigError) as caught:
            run_pipeline(settings, _pipeline(settings, table))
        message = str(caught.value)
        assert problem in message and "\n" not in message, message
    (tmp_path / "a-file").write_text("not a folder")
    for unusable in (tmp_path / "a-file" / "t", Path("/proc/sluice-delta-test/t")):
        with pytest.raises(ConfigError) as caught:
            run_pipeline(settings, _pipeline(settings, unusable))
        message = str(caught.value)
        assert str(unusable) in message and "\n" not in message, message
    collide = _pipeline(settings, tmp_path / "t", partition_by="event_type")
    with pytest.raises(ConfigError, match="partition_by") as caught:
        run_pipeline(settings, collide)
    assert "\n" not in str(caught.value)


# -- the orders example, upserted ------------------------------------------------------------

ORDER_FIELDS = ("order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at")


def _landed_orders(landing: Path) -> list[dict[str, Any]]:
    """Every well-formed CSV order row (the standard library's parse; malformed rows — a
    missing or mistyped field, more than two decimals, a bad timestamp — left out)."""
    good = []
    for path in sorted(landing.glob("dt=*/*.csv")):
        with path.open(newline="") as handle:
            for row in csv.reader(handle):
                if not row or row == list(ORDER_FIELDS) or len(row) != len(ORDER_FIELDS):
                    continue
                order_id, tenant, customer, currency, amount, when = row
                try:
                    value = Decimal(amount)
                except InvalidOperation:
                    continue
                if (
                    all(row)
                    and tenant.lstrip("-").isdigit()
                    and customer.lstrip("-").isdigit()
                    and value == value.quantize(Decimal("0.01"))
                    and when.startswith("20")
                    and "T" in when
                ):
                    good.append(
                        dict(
                            zip(
                                ORDER_FIELDS,
                                [order_id, int(tenant), int(customer), currency, value, when],
                                strict=True,
                            )
                        )
                    )
    return good


def test_the_orders_example_upserted_into_a_delta_table(make_settings: Any, tmp_path: Path) -> None:
    settings: Settings = make_settings(demo_events=1500, demo_users=200)
    table = tmp_path / "orders"
    pipeline = dataclasses.replace(
        orders,
        name=settings.source_name,
        source=dataclasses.replace(orders.source, landing=None),
        sink=DeltaSink(str(table), upsert_key=["order_id"]),
    )
    platform = open_platform(settings)
    try:
        pipeline.sample_data(
            SampleTarget(settings, landing_path(pipeline, settings), asyncpg_dsn(platform.url))
        )
        discover(platform, discovery_of(pipeline, settings))
        run_pipeline(settings, pipeline)
        # The oracle: the landing rows joined in SQL (rates, customers), refunds left out.
        with platform.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "CREATE TEMP TABLE landed (order_id text, tenant_id bigint,"
                    " customer_id bigint, currency text, amount numeric(12,2),"
                    " ordered_at timestamptz)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO landed VALUES (:order_id, :tenant_id, :customer_id,"
                    " :currency, :amount, CAST(:ordered_at AS timestamptz))"
                ),
                _landed_orders(landing_path(pipeline, settings)),
            )
            expected = {
                row[0]: (row[1], row[2])
                for row in conn.execute(
                    sa.text(
                        "SELECT l.order_id, round(l.amount * r.rate_to_eur, 2),"
                        " (l.ordered_at AT TIME ZONE 'UTC')::date"
                        " FROM landed l JOIN ref.fx_rates r ON r.code = l.currency"
                        " WHERE round(l.amount * r.rate_to_eur, 2) > 0"
                    )
                )
            }
    finally:
        platform.close()
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    got = Counter(row["order_id"] for row in rows)
    assert max(got.values()) == 1  # one row per key
    assert {r["order_id"]: (r["amount_eur"], r["dt"]) for r in rows} == expected
    # Run again: nothing new, nothing merged twice.
    version = DeltaTable(str(table)).version()
    assert run_pipeline(settings, pipeline).nothing_new
    assert DeltaTable(str(table)).version() == version


def test_an_at_least_once_run_appends_every_row(make_settings: Any, tmp_path: Path) -> None:
    """AT_LEAST_ONCE: each acknowledgement's files appended at once (no failure here, so
    exactly the oracle)."""
    settings: Settings = make_settings(
        demo_events=120, demo_days=2, demo_files_per_day=1, checkpointing_mode="AT_LEAST_ONCE"
    )
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    platform.close()
    table = tmp_path / "alo"
    run_pipeline(settings, _pipeline(settings, table))
    oracle, _bad = expected_events(Path(settings.landing_path))
    _check_exact(table, oracle)


def test_a_user_pipeline_of_csv_files_into_an_unpartitioned_table(
    make_settings: Any, tmp_path: Path
) -> None:
    """A pipeline defined here: unpartitioned CSV files → a Filter → DeltaSink; the table is
    unpartitioned, its files at its root, its rows exactly the kept CSV rows."""
    settings: Settings = make_settings()
    landing = tmp_path / "landing"
    landing.mkdir()
    written: list[tuple[str, int]] = []
    for f in range(3):
        lines = ["sku,qty"]
        for i in range(40):
            sku, qty = f"s{f}-{i}", (i * 7 + f) % 11 - 3
            lines.append(f"{sku},{qty}")
            written.append((sku, qty))
        (landing / f"part-{f}.csv").write_text("\n".join(lines) + "\n")
    table = tmp_path / "stock"
    pipeline = Pipeline(
        name=settings.source_name,
        source=FileSource(
            schema={"sku": "string", "qty": "int64"}, landing=str(landing), partition_by=None
        ),
        steps=[Filter(pc.field("qty") > 0)],
        sink=DeltaSink(str(table)),
    )
    platform = open_platform(settings)
    try:
        discover(platform, discovery_of(pipeline, settings))
    finally:
        platform.close()
    summary = run_pipeline(settings, pipeline)
    kept = sum(qty > 0 for _sku, qty in written)
    assert (summary.rows_out, summary.dropped) == (kept, len(written) - kept)
    delta = DeltaTable(str(table))
    assert delta.metadata().partition_columns == []
    assert all(
        "/" not in path for path in delta.get_add_actions(flatten=True).column("path").to_pylist()
    )
    got = Counter((r["sku"], r["qty"]) for r in delta.to_pyarrow_table().to_pylist())
    wanted = Counter((sku, qty) for sku, qty in written if qty > 0)
    assert got == wanted and max(got.values()) == 1
