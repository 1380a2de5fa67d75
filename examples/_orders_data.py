"""Sample data of the orders example: CSV orders, ``crm.customers`` and ``ref.fx_rates``.

Deterministic for a seed. Files are written under a hidden name and renamed into place. Per
file, a few rows are malformed (a missing field, a non-integer id, an amount with three
decimals, a bad timestamp, a wrong field count), some reference an unknown currency (dead
letters at the rate lookup) or an unknown customer (kept, with nulls), and some are refunds
(amount <= 0, dropped by the pipeline's filter).
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import asyncpg

from spark_jobs import SampleTarget, claim_demo_table

__all__ = ["RATES", "TENANTS", "write_orders"]

TENANTS = 5
#: Rates to EUR of the known currencies (``XXX`` is not one of them).
RATES = {
    "EUR": Decimal("1.000000"),
    "USD": Decimal("0.921300"),
    "GBP": Decimal("1.168400"),
    "JPY": Decimal("0.006100"),
    "CHF": Decimal("1.043700"),
}
SEGMENTS = ("retail", "smb", "enterprise")
HEADER = ["order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at"]
MALFORMED_EVERY = 400
UNKNOWN_CURRENCY_EVERY = 250
UNKNOWN_CUSTOMER_EVERY = 150
REFUND_EVERY = 20


def _malformed(kind: int, row: list[str]) -> list[str]:
    if kind == 0:
        return [row[0], "", *row[2:]]  # missing tenant_id
    if kind == 1:
        return [row[0], row[1], "c-17", *row[3:]]  # customer_id not an integer
    if kind == 2:
        return [*row[:4], "12.345", row[5]]  # three decimals for decimal(12,2)
    if kind == 3:
        return [*row[:5], "yesterday"]
    return row[:4]  # too few fields


def _orders(target: SampleTarget, customers_per_tenant: int) -> tuple[int, int, int]:
    settings = target.settings
    rng = random.Random(settings.demo_seed)
    n_files = settings.demo_days * settings.demo_files_per_day
    total = settings.demo_events
    currencies = list(RATES)
    written = malformed = 0
    for index in range(n_files):
        count = total // n_files + (1 if index < total % n_files else 0)
        day = settings.demo_start_date + timedelta(days=index // settings.demo_files_per_day)
        part = index % settings.demo_files_per_day
        folder = target.landing / f"dt={day.isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        buffer = io.StringIO()
        out = csv.writer(buffer, lineterminator="\n")
        out.writerow(HEADER)
        for i in range(count):
            tenant = rng.randint(1, TENANTS)
            customer = rng.randint(1, customers_per_tenant)
            if rng.randrange(UNKNOWN_CUSTOMER_EVERY) == 0:
                customer += customers_per_tenant
            currency = rng.choice(currencies)
            if rng.randrange(UNKNOWN_CURRENCY_EVERY) == 0:
                currency = "XXX"
            cents = rng.randint(100, 500_000)
            if rng.randrange(REFUND_EVERY) == 0:
                cents = -rng.randint(0, 20_000)
            seconds = (part * 86400 + i * 86400 / max(count, 1)) / settings.demo_files_per_day
            row = [
                f"o-{day:%Y%m%d}-{part:03d}-{i:07d}",
                str(tenant),
                str(customer),
                currency,
                str(Decimal(cents) / 100),
                (start + timedelta(seconds=seconds)).isoformat(),
            ]
            if rng.randrange(MALFORMED_EVERY) == 0:
                row = _malformed(rng.randrange(5), row)
                malformed += 1
            out.writerow(row)
        tmp = folder / f".part-{part:05d}.csv.tmp"
        tmp.write_text(buffer.getvalue())
        os.replace(tmp, folder / f"part-{part:05d}.csv")
        written += count
        if target.progress is not None:
            target.progress("orders", written, total)
    return n_files, written, malformed


async def _tables(dsn: str, customers_per_tenant: int, seed: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            # Both tables claimed before either is written: a refused one (not created by
            # sample data) rolls back the creation of the other, and nothing is written.
            await claim_demo_table(
                conn, "crm", "customers",
                "tenant_id bigint, id bigint, name text NOT NULL, segment text NOT NULL, "
                "PRIMARY KEY (tenant_id, id)",
            )  # fmt: skip
            await claim_demo_table(
                conn, "ref", "fx_rates", "code text PRIMARY KEY, rate_to_eur numeric(12,6) NOT NULL"
            )
            await conn.executemany(
                "INSERT INTO ref.fx_rates VALUES ($1, $2) ON CONFLICT (code) DO NOTHING",
                list(RATES.items()),
            )
            wanted = TENANTS * customers_per_tenant
            if await conn.fetchval("SELECT count(*) FROM crm.customers") == wanted:
                return
            rng = random.Random(seed)
            rows = [
                (tenant, customer, f"customer {tenant}-{customer}", rng.choice(SEGMENTS))
                for tenant in range(1, TENANTS + 1)
                for customer in range(1, customers_per_tenant + 1)
            ]
            await conn.execute("DELETE FROM crm.customers")
            await conn.copy_records_to_table(
                "customers", schema_name="crm", records=rows,
                columns=["tenant_id", "id", "name", "segment"],
            )  # fmt: skip
        await conn.execute("ANALYZE crm.customers")
    finally:
        await conn.close()


def write_orders(target: SampleTarget) -> str:
    settings = target.settings
    per_tenant = max(1, settings.demo_users // TENANTS)
    marker = target.landing / "_sample.txt"
    fingerprint = (
        f"{settings.demo_events}/{settings.demo_days}/{settings.demo_files_per_day}/"
        f"{settings.demo_start_date}/{settings.demo_seed}/{per_tenant}"
    )
    asyncio.run(_tables(target.dsn, per_tenant, settings.demo_seed))
    if marker.is_file() and marker.read_text().startswith(fingerprint + "\n"):
        return f"sample orders already in {target.landing}"
    files, written, malformed = _orders(target, per_tenant)
    Path(marker).write_text(f"{fingerprint}\n{files} {written} {malformed}\n")
    return (
        f"{files} files, {written:,} orders ({malformed} malformed) in {target.landing}; "
        f"{TENANTS * per_tenant:,} customers in crm.customers; {len(RATES)} rates in ref.fx_rates"
    )
