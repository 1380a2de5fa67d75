"""Test helpers of the Postgres CDC source: a concurrent change generator and the
table-equals-sink oracle (reusable by fault-injection and benchmark tests).

``ChangeGenerator`` writes to a table ``(id bigint primary key, v text, n bigint)`` from its
own thread: inserts of new keys, updates of a few hot keys over and over (the same row
changed many times), deletes and re-inserts of deleted keys, key changes (``UPDATE … SET
id``), and transactions holding several changes of the same row. The oracle is the table
itself, read independently of the pipeline: ``compare`` says which keys the sink misses,
has in excess, holds twice, or holds with other values.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink

__all__ = [
    "ChangeGenerator",
    "Diff",
    "cdc_pipeline",
    "compare",
    "create_table",
    "libpq_url",
    "rows_of",
]


def cdc_pipeline(name: str, table: str, *, rows_per_chunk: int = 40) -> Pipeline:
    """``table`` (see :func:`create_table`) into ``<table>_out``, upserted on ``id``."""
    return Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=[table],
            key="id",
            schema={"id": "int64", "v": "string", "n": "int64"},
            rows_per_chunk=rows_per_chunk,
        ),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL as libpq takes it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def create_table(engine: Engine, table: str, rows: int = 0) -> None:
    """``table (id bigint primary key, v text, n bigint)`` with ``rows`` rows (ids 1..rows)."""
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text, n bigint)"))
        if rows:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} SELECT g, 'r' || g, g FROM generate_series(1, :rows) g"
                ),
                {"rows": rows},
            )


def rows_of(engine: Engine, table: str) -> list[tuple[Any, ...]]:
    """``(id, v, n)`` of every row, in id order (duplicates kept)."""
    with engine.connect() as conn:
        return [
            tuple(r) for r in conn.execute(sa.text(f"SELECT id, v, n FROM {table} ORDER BY id"))
        ]


@dataclass
class Diff:
    missing: list[Any] = field(default_factory=list)
    extra: list[Any] = field(default_factory=list)
    duplicates: list[Any] = field(default_factory=list)
    differing: list[Any] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.duplicates or self.differing)

    def __str__(self) -> str:
        return (
            f"missing {len(self.missing)} {self.missing[:5]}, extra {len(self.extra)}"
            f" {self.extra[:5]}, duplicates {len(self.duplicates)} {self.duplicates[:5]},"
            f" differing {len(self.differing)} {self.differing[:5]}"
        )


def compare(source: list[tuple[Any, ...]], sink: list[tuple[Any, ...]]) -> Diff:
    """How ``sink`` rows ``(key, …)`` differ from ``source`` rows (the key first)."""
    expected = {r[0]: r for r in source}
    diff = Diff()
    seen: dict[Any, tuple[Any, ...]] = {}
    for row in sink:
        if row[0] in seen:
            diff.duplicates.append(row[0])
        seen[row[0]] = row
    diff.missing = sorted(k for k in expected if k not in seen)
    diff.extra = sorted(k for k in seen if k not in expected)
    diff.differing = sorted(k for k in expected if k in seen and seen[k] != expected[k])
    return diff


class ChangeGenerator(threading.Thread):
    """Random changes to ``table`` until ``stop()`` (or ``max_ops``); ``ops`` counts the
    committed statements by kind. ``first_new_key``: the ids it inserts start there."""

    def __init__(
        self,
        url: str,
        table: str,
        *,
        first_new_key: int,
        hot_keys: int = 20,
        seed: int = 7,
        pause: float = 0.002,
        max_ops: int | None = None,
    ) -> None:
        super().__init__(name=f"changes-{table}", daemon=True)
        self._url = libpq_url(url)
        self._table = table
        self._next = first_new_key
        self._hot = hot_keys
        self._random = random.Random(seed)
        self._pause = pause
        self._max = max_ops
        self._stop_event = threading.Event()
        self.ops: dict[str, int] = {}
        self.error: BaseException | None = None

    def stop(self) -> None:
        """Stop now (and raise what failed the thread)."""
        self._stop_event.set()
        self.finish()

    def finish(self, timeout: float = 120) -> None:
        """Wait for the thread to end (``max_ops`` done) and raise what failed it."""
        self.join(timeout)
        assert not self.is_alive(), "the change generator did not end"
        if self.error is not None:
            raise self.error

    def run(self) -> None:
        try:
            with psycopg.connect(self._url, autocommit=True) as conn:
                done = 0
                while not self._stop_event.is_set() and (self._max is None or done < self._max):
                    self._one(conn)
                    done += 1
                    if self._pause:
                        time.sleep(self._pause)
        except BaseException as exc:  # raised by stop()
            self.error = exc

    def _count(self, kind: str) -> None:
        self.ops[kind] = self.ops.get(kind, 0) + 1

    def _existing(self, conn: psycopg.Connection[Any]) -> int | None:
        row = conn.execute(
            f"SELECT id FROM {self._table} WHERE id >= %s ORDER BY id LIMIT 1",
            (self._random.randint(1, max(1, self._next)),),
        ).fetchone()
        return None if row is None else int(row[0])

    def _one(self, conn: psycopg.Connection[Any]) -> None:
        t, r = self._table, self._random
        roll = r.random()
        if roll < 0.3:
            self._next += 1
            conn.execute(f"INSERT INTO {t} VALUES (%s, %s, %s)", (self._next, "new", self._next))
            self._count("insert")
        elif roll < 0.6:  # a hot row, changed many times
            key = r.randint(1, self._hot)
            conn.execute(
                f"INSERT INTO {t} VALUES (%s, 'hot', 0) ON CONFLICT (id) DO UPDATE"
                f" SET n = {t}.n + 1, v = 'hot' || ({t}.n + 1)",
                (key,),
            )
            self._count("hot")
        elif roll < 0.75:
            key = self._existing(conn)
            if key is not None:
                conn.execute(f"UPDATE {t} SET v = %s, n = n * 2 WHERE id = %s", (f"u{key}", key))
                self._count("update")
        elif roll < 0.88:
            key = self._existing(conn)
            if key is not None:
                conn.execute(f"DELETE FROM {t} WHERE id = %s", (key,))
                self._count("delete")
        elif roll < 0.94:  # several changes of one row in one transaction
            self._next += 1
            with conn.transaction():
                conn.execute(f"INSERT INTO {t} VALUES (%s, 'a', 1)", (self._next,))
                conn.execute(f"UPDATE {t} SET v = 'b', n = 2 WHERE id = %s", (self._next,))
                if r.random() < 0.5:
                    conn.execute(f"DELETE FROM {t} WHERE id = %s", (self._next,))
            self._count("txn")
        else:  # a key change
            key = self._existing(conn)
            if key is not None and key > self._hot:
                self._next += 1
                conn.execute(f"UPDATE {t} SET id = %s WHERE id = %s", (self._next, key))
                self._count("rekey")
