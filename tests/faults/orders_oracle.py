"""An independent oracle of the ``orders`` example pipeline and the check of its Postgres output.

The landing CSVs are parsed with the standard library's ``csv`` (not Sluice's reader), loaded
into a temporary table and joined in SQL with ``crm.customers`` (left join on the composite
key) and ``ref.fx_rates`` (inner: an unknown currency is a dead letter); ``amount_eur`` is
Postgres' ``round(amount * rate, 2)`` (numeric: half away from zero), and only orders with
``amount_eur > 0`` are expected in ``analytics.orders_enriched``.

An upsert sink cannot hold a key twice, so duplicates are counted where they would show: in
the committed ``sluice.sink_transactions`` — every row committed more than once is a row
counted in ``row_count`` beyond the rows of the table. Their dropped and dead-letter counts
must match the oracle too.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from spark_jobs.sink import staged_rows

__all__ = ["LandedOrders", "OrdersVerdict", "landed_orders", "verify_orders"]

HEADER = ["order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at"]
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64 = (-(2**63), 2**63 - 1)
#: decimal(12,2): at most 2 decimals, at most 10 digits before the point.
_AMOUNT_DECIMALS = 2
_AMOUNT_LIMIT = Decimal(10) ** 10

Order = tuple[str, date, int, int, str, Decimal, datetime]


@dataclass(frozen=True)
class LandedOrders:
    orders: list[Order]  # (order_id, dt, tenant_id, customer_id, currency, amount, ordered_at)
    malformed: int
    files: int


def _integer(text: str) -> int | None:
    if not _INTEGER.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64[0] <= value <= _INT64[1] else None


def _amount(text: str) -> Decimal | None:
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if exponent < -_AMOUNT_DECIMALS or abs(value) >= _AMOUNT_LIMIT:
        return None
    return value


def _timestamp(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _parse(row: list[str], day: date) -> Order | None:
    if len(row) != len(HEADER) or any(not field for field in row):
        return None
    order_id, tenant, customer, currency, amount, ordered_at = row
    parsed = (_integer(tenant), _integer(customer), _amount(amount), _timestamp(ordered_at))
    tenant_id, customer_id, value, when = parsed
    if tenant_id is None or customer_id is None or value is None or when is None:
        return None
    return (order_id, day, tenant_id, customer_id, currency, value, when)


def landed_orders(landing: Path) -> LandedOrders:
    """The well-formed orders of every ``dt=*/*.csv`` under ``landing`` (``dt`` = the
    folder's date) and the number of malformed rows. Blank lines are neither."""
    orders: list[Order] = []
    malformed = files = 0
    for path in sorted(landing.glob("dt=*/*.csv")):
        files += 1
        day = date.fromisoformat(path.parent.name.removeprefix("dt="))
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle, strict=True)
            assert next(reader) == HEADER, f"{path}: unexpected header"
            for row in reader:
                if not row:
                    continue
                order = _parse(row, day)
                if order is None:
                    malformed += 1
                else:
                    orders.append(order)
    ids = [order[0] for order in orders]
    assert len(set(ids)) == len(ids), "the oracle expects unique order ids"
    return LandedOrders(orders, malformed, files)


@dataclass(frozen=True)
class OrdersVerdict:
    rows: int  # rows of analytics.orders_enriched
    expected_rows: int
    committed_rows: int  # sum of row_count over committed sink transactions
    duplicates: int
    missing: int
    unexpected: int
    wrong: int
    dead_letters: int  # rows of sluice.dead_letters
    expected_dead_letters: int  # malformed rows + well-formed rows of an unknown currency
    committed_dead_letters: int  # dead letters in committed sink transactions
    dropped: int  # dropped_count over committed sink transactions
    expected_dropped: int  # well-formed, known currency, amount_eur <= 0
    uncommitted: int  # sink transactions never committed (aborted or superseded)
    staged_left: int  # rows left in staged batch tables
    splits: dict[str, int]

    def line(self, mode: str) -> str:
        return (
            f"RESULT ORDERS {mode}: rows={self.rows} duplicates={self.duplicates} "
            f"missing={self.missing} unexpected={self.unexpected} "
            f"wrong_enrichment={self.wrong} dead_letters={self.dead_letters} "
            f"expected_dead_letters={self.expected_dead_letters} "
            f"committed_rows={self.committed_rows} expected_rows={self.expected_rows} "
            f"committed_dead_letters={self.committed_dead_letters} dropped={self.dropped} "
            f"expected_dropped={self.expected_dropped} uncommitted_txns={self.uncommitted} "
            f"staged_left={self.staged_left} splits={self.splits}"
        )


#: The Postgres sink's table of the example (the default of ``verify_orders``).
_TABLE = "analytics.orders_enriched"

_LANDED = """
CREATE TEMP TABLE oracle_landed (
    order_id text PRIMARY KEY, dt date NOT NULL, tenant_id bigint NOT NULL,
    customer_id bigint NOT NULL, currency text NOT NULL, amount numeric NOT NULL,
    ordered_at timestamptz NOT NULL
)
"""

_EXPECTED = """
CREATE TEMP TABLE oracle_expected AS
SELECT l.order_id, l.tenant_id, l.customer_id, l.currency, l.amount, l.ordered_at,
       c.name AS customer_name, c.segment, r.rate_to_eur,
       round(l.amount * r.rate_to_eur, 2) AS amount_eur, l.dt
FROM oracle_landed AS l
LEFT JOIN crm.customers AS c ON c.tenant_id = l.tenant_id AND c.id = l.customer_id
LEFT JOIN ref.fx_rates AS r ON r.code = l.currency
"""

_FIELDS = (
    "tenant_id",
    "customer_id",
    "currency",
    "amount",
    "ordered_at",
    "customer_name",
    "segment",
    "rate_to_eur",
    "amount_eur",
    "dt",
)


def _row(alias: str) -> str:
    return "(" + ", ".join(f"{alias}.{name}" for name in _FIELDS) + ")"


_COMPARE = f"""
SELECT count(*) FILTER (WHERE o.order_id IS NULL) AS missing,
       count(*) FILTER (WHERE e.order_id IS NULL) AS unexpected,
       count(*) FILTER (
           WHERE e.order_id IS NOT NULL AND o.order_id IS NOT NULL
             AND {_row("e")} IS DISTINCT FROM {_row("o")}
       ) AS wrong
FROM (SELECT * FROM oracle_expected WHERE rate_to_eur IS NOT NULL AND amount_eur > 0) AS e
FULL JOIN analytics.orders_enriched AS o ON o.order_id = e.order_id
"""

_WRONG_SAMPLE = f"""
SELECT e.order_id, {_row("e")} AS want, {_row("o")} AS got
FROM oracle_expected AS e JOIN analytics.orders_enriched AS o ON o.order_id = e.order_id
WHERE e.rate_to_eur IS NOT NULL AND e.amount_eur > 0 AND {_row("e")} IS DISTINCT FROM {_row("o")}
ORDER BY e.order_id LIMIT 5
"""

_TRANSACTIONS = """
SELECT coalesce(sum(row_count) FILTER (WHERE committed), 0),
       coalesce(sum(dropped_count) FILTER (WHERE committed), 0),
       coalesce(sum(jsonb_array_length(dead_letters)) FILTER (WHERE committed), 0),
       count(*) FILTER (WHERE NOT committed)
FROM sluice.sink_transactions WHERE source = :s
"""


def verify_orders(
    db_url: str,
    pipeline: str,
    landed: LandedOrders,
    *,
    table: str = _TABLE,
    staged: bool = True,
) -> OrdersVerdict:
    """Compare ``table`` (the Postgres sink's; or the rows a test read from another sink's
    table and loaded) and the committed sink transactions and dead letters of ``pipeline``
    with ``landed`` joined with the reference tables. ``staged``: count the rows left in
    the Postgres sink's staged batch tables (False: the sink has none)."""
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(_LANDED))
            raw: Any = conn.connection.driver_connection  # psycopg: COPY the landed orders
            with raw.cursor() as cursor, cursor.copy("COPY oracle_landed FROM STDIN") as copy:
                for order in landed.orders:
                    copy.write_row(order)
            conn.execute(sa.text(_EXPECTED))
            expected_rows, expected_dropped, unknown_currency = conn.execute(
                sa.text(
                    "SELECT count(*) FILTER (WHERE rate_to_eur IS NOT NULL AND amount_eur > 0),"
                    " count(*) FILTER (WHERE rate_to_eur IS NOT NULL AND amount_eur <= 0),"
                    " count(*) FILTER (WHERE rate_to_eur IS NULL) FROM oracle_expected"
                )
            ).one()
            compare, sample = (q.replace(_TABLE, table) for q in (_COMPARE, _WRONG_SAMPLE))
            missing, unexpected, wrong = conn.execute(sa.text(compare)).one()
            for order_id, want, got in conn.execute(sa.text(sample)):
                print(f"wrong row {order_id}: got {got}, want {want}", flush=True)
            table_rows = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            committed, dropped, txn_dead, uncommitted = conn.execute(
                sa.text(_TRANSACTIONS), {"s": pipeline}
            ).one()
            dead = conn.execute(
                sa.text("SELECT count(*) FROM sluice.dead_letters WHERE source = :s"),
                {"s": pipeline},
            ).scalar_one()
            staged_left = staged_rows(conn, *_TABLE.split(".")) if staged else 0
            splits: dict[str, int] = dict(
                conn.execute(
                    sa.text(
                        "SELECT status, count(*) FROM sluice.splits WHERE source = :s"
                        " GROUP BY status"
                    ),
                    {"s": pipeline},
                ).all()
            )
            conn.rollback()  # the oracle's temporary tables go with its transaction
    finally:
        engine.dispose()
    return OrdersVerdict(
        rows=int(table_rows),
        expected_rows=int(expected_rows),
        committed_rows=int(committed),
        duplicates=int(committed) - int(table_rows),
        missing=int(missing),
        unexpected=int(unexpected),
        wrong=int(wrong),
        dead_letters=int(dead),
        expected_dead_letters=landed.malformed + int(unknown_currency),
        committed_dead_letters=int(txn_dead),
        dropped=int(dropped),
        expected_dropped=int(expected_dropped),
        uncommitted=int(uncommitted),
        staged_left=int(staged_left),
        splits={str(k): int(v) for k, v in splits.items()},
    )
