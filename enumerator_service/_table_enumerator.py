"""Work discovery over a Postgres table: integer-key ranges of a target row count."""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._config import validate_identifier
from enumerator_service._enumerator import DiscoveryResult, SplitEnumerator
from enumerator_service._identifiers import qualified_name, quote_identifier
from enumerator_service._splits import TableRangeSplit

__all__ = ["TableRangeEnumerator"]


class TableRangeEnumerator(SplitEnumerator):
    """Splits ``schema.table`` into ``[low, high)`` ranges of its integer ``key_column``.

    The first tick covers the keys present (bounded: a backfill of the table). Later ticks
    register ranges for keys appended above the last covered one, so an append-only table is
    read continuously; the cursor is a single key. Rows inserted *below* it later are not seen.
    """

    def __init__(
        self,
        engine: Engine,
        source: str,
        *,
        schema: str,
        table: str,
        key_column: str,
        rows_per_split: int = 100_000,
        lease_seconds: float = 60.0,
    ) -> None:
        super().__init__(engine, source, lease_seconds=lease_seconds)
        # The split names the table as ``schema.table`` (the reader quotes each part); the
        # statements here use the quoted names, so reserved words work as names.
        self._table = (
            f"{validate_identifier(schema, 'schema')}.{validate_identifier(table, 'table')}"
        )
        self._key = validate_identifier(key_column, "key_column")
        self._quoted_table = qualified_name(schema, table)
        self._quoted_key = quote_identifier(key_column)
        if rows_per_split < 1:
            raise ValueError("rows_per_split must be positive")
        self._rows = rows_per_split

    def cursor(self) -> dict[str, Any]:
        return self._load_cursor({"next_key": None})

    def discover(self) -> DiscoveryResult:
        next_key = self.cursor()["next_key"]
        key = self._quoted_key
        where = "" if next_key is None else f"WHERE {key} >= :next_key"
        stats = f"SELECT min({key}), max({key}), count(*) FROM {self._quoted_table}"
        with self._engine.connect() as conn:
            low, high, rows = conn.execute(
                sa.text(f"{stats} {where}"),
                {"next_key": next_key},
            ).one()
        if not rows:
            return DiscoveryResult(0, 0, {"next_key": next_key}, seen_unit="key ranges")
        # Ranges of equal key width sized for ~rows_per_split rows at the observed density.
        width = max(1, math.ceil((high - low + 1) * self._rows / rows))
        splits = [
            TableRangeSplit(
                self._source, self._table, self._key, start, min(start + width, high + 1)
            )
            for start in range(low, high + 1, width)
        ]
        added = self._store.register(splits)
        cursor = {"next_key": high + 1}
        self._save_cursor(cursor)
        return DiscoveryResult(len(splits), added, cursor, seen_unit="key ranges")
