"""The orders example end to end (real Postgres, real local Spark): CSV orders through two
lookups (a composite key; a fully cached rate table), a Map and a Filter, upserted into
Postgres — against an independent oracle: the landing CSVs parsed with the standard library
and joined in SQL."""

from __future__ import annotations

import csv
import dataclasses
import secrets
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings

from enumerator_service import asyncpg_dsn
from enumerator_service._operations import Platform, discover, open_platform, platform_status
from examples.orders import orders
from spark_jobs import PostgresSink, SampleTarget
from spark_jobs.connectors.files import landing_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

FIELDS = ("order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at")


def oracle_rows(landing: Path) -> tuple[list[dict[str, Any]], int]:
    """The well-formed orders of every CSV (standard library parse) and how many rows are
    malformed (a missing or mistyped field, more than two decimals, a bad timestamp)."""
    good: list[dict[str, Any]] = []
    bad = 0
    for path in sorted(landing.glob("dt=*/*.csv")):
        with path.open(newline="") as handle:
            for row in csv.reader(handle):
                if row == list(FIELDS) or not row:
                    continue
                try:
                    order_id, tenant, customer, currency, amount, when = row
                    value = Decimal(amount)
                    ok = (
                        all(row)
                        and tenant.lstrip("-").isdigit()
                        and customer.lstrip("-").isdigit()
                        and value == value.quantize(Decimal("0.01"))
                        and when.startswith(("20",))
                        and "T" in when
                    )
                except (ValueError, InvalidOperation):
                    ok = False
                if ok:
                    good.append(
                        dict(
                            zip(
                                FIELDS,
                                [order_id, int(tenant), int(customer), currency, value, when],
                                strict=True,
                            )
                        )
                    )
                else:
                    bad += 1
    return good, bad


@pytest.fixture
def prepared(make_settings: Any) -> Iterator[tuple[TestSettings, Platform, Any]]:
    settings: TestSettings = make_settings(demo_events=4000, demo_users=500)
    table = f"analytics.orders_{secrets.token_hex(3)}"
    pipeline = dataclasses.replace(
        orders,
        name=settings.source_name,
        source=dataclasses.replace(orders.source, landing=None),
        sink=PostgresSink(table, upsert_key=["order_id"]),
    )
    platform = open_platform(settings)
    said = pipeline.sample_data(
        SampleTarget(settings, landing_path(pipeline, settings), asyncpg_dsn(platform.url))
    )
    assert "orders" in said
    yield settings, platform, pipeline
    platform.close()


def test_orders_equal_a_sql_join_of_the_landing_files(
    prepared: tuple[TestSettings, Platform, Any],
) -> None:
    settings, platform, pipeline = prepared
    found = discover(platform, discovery_of(pipeline, settings))
    assert found.splits_registered == settings.demo_days * settings.demo_files_per_day
    summary = run_pipeline(settings, pipeline)
    good, malformed = oracle_rows(landing_path(pipeline, settings))
    assert malformed > 0
    table = ".".join(pipeline.plan.sink.options.table)
    with platform.engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TEMP TABLE landed (order_id text, tenant_id bigint, customer_id bigint,"
                " currency text, amount numeric(12,2), ordered_at timestamptz)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO landed VALUES (:order_id, :tenant_id, :customer_id, :currency,"
                " :amount, CAST(:ordered_at AS timestamptz))"
            ),
            good,
        )
        unknown_currency = conn.execute(
            sa.text(
                "SELECT count(*) FROM landed l"
                " WHERE NOT EXISTS (SELECT 1 FROM ref.fx_rates r WHERE r.code = l.currency)"
            )
        ).scalar_one()
        expected = conn.execute(
            sa.text(
                "SELECT l.order_id, l.tenant_id, l.customer_id, l.currency, l.amount,"
                " l.ordered_at, c.name, c.segment, r.rate_to_eur,"
                " round(l.amount * r.rate_to_eur, 2) AS amount_eur"
                " FROM landed l JOIN ref.fx_rates r ON r.code = l.currency"
                " LEFT JOIN crm.customers c ON c.tenant_id = l.tenant_id AND c.id = l.customer_id"
                " WHERE round(l.amount * r.rate_to_eur, 2) > 0 ORDER BY l.order_id"
            )
        ).all()
        actual = conn.execute(
            sa.text(
                "SELECT order_id, tenant_id, customer_id, currency, amount, ordered_at,"
                " customer_name, segment, rate_to_eur, amount_eur"
                f" FROM {table} ORDER BY order_id"
            )
        ).all()
        dated = conn.execute(
            sa.text(
                f"SELECT count(*) FROM {table} WHERE dt <> (ordered_at AT TIME ZONE 'UTC')::date"
            )
        ).scalar_one()
    assert actual == expected
    assert any(row.customer_name is None for row in actual), "unknown customers are kept"
    assert dated == 0  # each row is in its day's partition
    # Rows in = rows out + removed by the filter + dead letters (malformed, unknown currency).
    refunds = len(good) - unknown_currency - len(expected)
    assert refunds > 0
    assert (summary.rows_out, summary.dropped, summary.dead_letters) == (
        len(expected),
        refunds,
        malformed + unknown_currency,
    )
    status = platform_status(platform, pipeline.name)
    reasons = dict(status.dead_letter_reasons)
    assert reasons["lookup miss"] == unknown_currency
    assert status.rows_committed == len(expected)
    assert run_pipeline(settings, pipeline).nothing_new
