"""The orders pipeline: CSV orders of several tenants, enriched with their customer and
converted to euros, upserted into Postgres.

- source: ``data/landing/orders/dt=YYYY-MM-DD/*.csv`` with a header line;
- step 1: ``crm.customers`` on the composite key (tenant_id, customer_id) → name, segment
  (unknown customers are kept, with nulls);
- step 2: ``ref.fx_rates`` on the currency code → rate_to_eur, the whole (small) table
  cached in every task and reloaded every 10 minutes; an unknown currency is a dead letter;
- step 3: ``amount_eur`` = amount * rate, rounded to cents (half away from zero);
- step 4: only orders with a positive amount (refunds and zero orders are dropped);
- sink: ``analytics.orders_enriched``, one row per ``order_id`` (upsert).
"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from examples._orders_data import write_orders
from spark_jobs import (
    FileSource,
    Filter,
    FullCache,
    Lookup,
    Map,
    Pipeline,
    PostgresSink,
    SampleTarget,
)

__all__ = ["add_amount_eur", "orders", "write_sample_data"]


def add_amount_eur(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``amount_eur``: the amount in euros, rounded to cents (half away from zero)."""
    product = pc.multiply(batch.column("amount"), batch.column("rate_to_eur"))
    rounded = pc.round(product, ndigits=2, round_mode="half_towards_infinity")
    return batch.append_column("amount_eur", rounded.cast(pa.decimal128(18, 2)))


def write_sample_data(target: SampleTarget) -> str:
    """Sample orders (``SLUICE_DEMO_EVENTS`` over ``SLUICE_DEMO_DAYS``), ``crm.customers``
    (``SLUICE_DEMO_USERS`` rows over 5 tenants) and ``ref.fx_rates``."""
    return write_orders(target)


orders = Pipeline(
    name="orders",
    description="Orders with their customer and their amount in euros, upserted by order id.",
    source=FileSource(
        schema={
            "order_id": "string",
            "tenant_id": "int64",
            "customer_id": "int64",
            "currency": "string",
            "amount": "decimal(12,2)",
            "ordered_at": "timestamp",
        },
        required=["order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at"],
        event_time="ordered_at",
        partition_by="day",
    ),
    steps=[
        Lookup(
            "crm.customers",
            on={"tenant_id": "tenant_id", "customer_id": "id"},
            columns={"name": "customer_name", "segment": "segment"},
            on_miss="keep",
        ),
        Lookup(
            "ref.fx_rates",
            on={"currency": "code"},
            columns=["rate_to_eur"],
            on_miss="dead_letter",
            cache=FullCache(reload_every="10m"),
        ),
        Map(add_amount_eur, output={"amount_eur": "decimal(18,2)"}),
        # A decimal literal: Arrow compares decimals with integers only up to small precisions.
        Filter(pc.field("amount_eur") > Decimal(0)),
    ],
    sink=PostgresSink("analytics.orders_enriched", upsert_key=["order_id"]),
    sample_data=write_sample_data,
)
