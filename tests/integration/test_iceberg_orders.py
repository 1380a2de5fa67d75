"""The orders example (CSV, a composite-key lookup, a cached rate table, a Map, a Filter)
with its sink replaced by an Iceberg upsert sink: the table holds each order once, equal to
an independent oracle — the landing CSVs parsed with the standard library and joined in SQL
— read back by PyIceberg's scan and by DuckDB over the current snapshot's data files."""

from __future__ import annotations

import csv
import dataclasses
from collections import Counter
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings

from enumerator_service import asyncpg_dsn
from enumerator_service._operations import discover, open_platform
from examples.orders import orders
from spark_jobs import IcebergSink, SampleTarget
from spark_jobs.connectors.files import landing_path
from spark_jobs.connectors.iceberg._catalog import open_catalog
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

FIELDS = ("order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at")


def landed(landing: Path) -> list[dict[str, Any]]:
    """The well-formed orders of every CSV (standard library parse)."""
    good = []
    for path in sorted(landing.glob("dt=*/*.csv")):
        with path.open(newline="") as handle:
            for row in csv.reader(handle):
                if row == list(FIELDS) or len(row) != len(FIELDS) or not all(row):
                    continue
                order_id, tenant, customer, currency, amount, when = row
                try:
                    value = Decimal(amount)
                except InvalidOperation:
                    continue
                if (
                    tenant.lstrip("-").isdigit()
                    and customer.lstrip("-").isdigit()
                    and value == value.quantize(Decimal("0.01"))
                    and when.startswith("20")
                    and "T" in when
                ):
                    good.append(
                        dict(
                            zip(
                                FIELDS,
                                [order_id, tenant, customer, currency, value, when],
                                strict=True,
                            )
                        )
                    )
    return good


def test_the_orders_example_upserted_into_iceberg_equals_a_sql_join(make_settings: Any) -> None:
    settings: Settings = make_settings(demo_events=2000, demo_users=300)
    table = f"{settings.source_name}.orders"
    pipeline = dataclasses.replace(
        orders,
        name=settings.source_name,
        source=dataclasses.replace(orders.source, landing=None),
        sink=IcebergSink(table, upsert_key=["order_id"]),
    )
    platform = open_platform(settings)
    try:
        pipeline.sample_data(
            SampleTarget(settings, landing_path(pipeline, settings), asyncpg_dsn(platform.url))
        )
        discover(platform, discovery_of(pipeline, settings))
        run_pipeline(settings, pipeline)
        with platform.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "CREATE TEMP TABLE landed (order_id text, tenant_id bigint, customer_id"
                    " bigint, currency text, amount numeric(12,2), ordered_at timestamptz)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO landed VALUES (:order_id, CAST(:tenant_id AS bigint),"
                    " CAST(:customer_id AS bigint), :currency, :amount,"
                    " CAST(:ordered_at AS timestamptz))"
                ),
                landed(landing_path(pipeline, settings)),
            )
            expected = {
                r.order_id: r.amount_eur
                for r in conn.execute(
                    sa.text(
                        "SELECT l.order_id, round(l.amount * r.rate_to_eur, 2) AS amount_eur"
                        " FROM landed l JOIN ref.fx_rates r ON r.code = l.currency"
                        " WHERE round(l.amount * r.rate_to_eur, 2) > 0"
                    )
                )
            }
        iceberg = open_catalog(platform.engine, None, None).load_table(table)
    finally:
        platform.close()
    scanned = iceberg.scan(selected_fields=("order_id", "amount_eur")).to_arrow().to_pylist()
    paths = [t.file.file_path.removeprefix("file://") for t in iceberg.scan().plan_files()]
    read = duckdb.sql(f"SELECT order_id, amount_eur FROM read_parquet({paths!r})").fetchall()
    assert len(expected) > 100
    for rows in ([(r["order_id"], r["amount_eur"]) for r in scanned], read):
        counts = Counter(order_id for order_id, _ in rows)
        assert sum(n - 1 for n in counts.values()) == 0  # no order twice
        assert dict(rows) == expected  # none missing, none extra, the same amounts
