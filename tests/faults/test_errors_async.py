"""Errors in async steps are faults too (issue 21, rows 1 and 2): an ``AsyncMap`` element that
raises once while other elements are in flight, and a lookup whose table is locked past its
timeout — once (the stage restarts and the output is exact) and for good (the run fails, and
after the lock is gone a rerun completes it exactly). Each case checks the output against the
oracle of what was in the files: duplicates = 0, missing = 0.

Before the fix (main d290c67) the operator completed a failed element empty, emitted it, and
raised only once its queue drained; a checkpoint taken in between committed past the failed
block: ``test_an_async_map_that_raises_once_loses_nothing`` read 11,950 of 12,000 ids.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pyarrow.dataset as ds
import pytest
from conftest import TestSettings

from enumerator_service._operations import discover, open_platform
from spark_jobs import (
    AsyncMap,
    CoroutineAsyncFunction,
    FileSource,
    Lookup,
    ParquetSink,
    Pipeline,
)
from spark_jobs._outcomes import RunFailed
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(300)]

FILES = 2
PER_FILE = 6_000
FAIL_N = 2_500  # this record's first call raises
SLOW = range(FAIL_N + 1, FAIL_N + 41)  # in flight, slow, when FAIL_N fails


def write_landing(settings: TestSettings, name: str) -> set[str]:
    folder = settings.data_path / "landing" / name / "dt=2026-03-01"
    folder.mkdir(parents=True)
    ids: set[str] = set()
    for f in range(FILES):
        lines = []
        for i in range(PER_FILE):
            n = f * PER_FILE + i
            ids.add(f"r{n:06d}")
            lines.append(orjson.dumps({"id": f"r{n:06d}", "n": n, "user_id": n % 50}) + b"\n")
        (folder / f"part-{f}.jsonl").write_bytes(b"".join(lines))
    return ids


def output_ids(pipeline: Pipeline, settings: TestSettings) -> Counter[str]:
    path = output_path(pipeline, settings)
    if not Path(path).exists():
        return Counter()
    rows = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=["id"])
    return Counter(rows.column("id").to_pylist())


def assert_exact(found: Counter[str], expected: set[str]) -> None:
    duplicates = sum(c - 1 for c in found.values() if c > 1)
    missing = len(expected - set(found))
    assert (duplicates, missing, len(found)) == (0, 0, len(expected))


class RaiseOnce(CoroutineAsyncFunction[dict[str, Any], dict[str, Any]]):
    """Raises for record FAIL_N on its first call in any process (a marker file, created
    exclusively, makes "once" hold across Spark's Python workers and stage attempts)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    async def invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        n = value["n"]
        if n == FAIL_N:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                await asyncio.sleep(0.05)
                raise RuntimeError(f"scoring service refused record {n}")
        await asyncio.sleep(1.5 if n in SLOW else 0.001)
        return [{"score": n * 2}]


def test_an_async_map_that_raises_once_loses_nothing(make_settings: Any, tmp_path: Path) -> None:
    settings: TestSettings = make_settings(read_block_bytes=16_384, checkpoint_interval_seconds=0.2)
    platform = open_platform(settings)
    name = f"araise_{secrets.token_hex(3)}"
    try:
        expected = write_landing(settings, name)
        pipeline = Pipeline(
            name=name,
            source=FileSource(schema={"id": "string", "n": "int64", "user_id": "int64"}),
            steps=[
                AsyncMap(
                    RaiseOnce(tmp_path / "raised"),
                    output={"score": "int64"},
                    per="record",
                    capacity=60,
                    mode="unordered",
                    name="score",
                )
            ],
            sink=ParquetSink(name),
        )
        discover(platform, discovery_of(pipeline, settings))
        run_pipeline(settings, pipeline)
        assert (tmp_path / "raised").exists()  # the error really happened
        assert_exact(output_ids(pipeline, settings), expected)
    finally:
        platform.close()


@pytest.fixture
def users_table(db_url: str) -> Iterator[str]:
    table = f"users_{secrets.token_hex(3)}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id bigint PRIMARY KEY, country text)")
        conn.execute(f"INSERT INTO public.{table} SELECT g, 'c' || g FROM generate_series(0, 49) g")
    yield table
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS public.{table}")


class TableLock(threading.Thread):
    """Holds ACCESS EXCLUSIVE on a table until a lookup has waited on it for ``hold_after``
    seconds (past the lookup's 1 s timeout: at least one element times out), or until
    :meth:`release` when ``hold_after`` is None."""

    def __init__(self, db_url: str, table: str, hold_after: float | None) -> None:
        super().__init__(daemon=True)
        self.db_url, self.table, self.hold_after = db_url, table, hold_after
        self.locked, self.waited, self._release = (threading.Event() for _ in range(3))

    def run(self) -> None:
        with psycopg.connect(self.db_url) as conn, psycopg.connect(self.db_url) as probe:
            conn.execute(f"LOCK TABLE public.{self.table} IN ACCESS EXCLUSIVE MODE")
            self.locked.set()
            while not self._release.is_set() and not self.waited.is_set():
                waiting = probe.execute(
                    "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
                    (f"public.{self.table}",),
                ).fetchone()
                probe.rollback()
                if waiting and waiting[0]:
                    self.waited.set()
                self._release.wait(0.05)
            if self.hold_after is not None:
                self._release.wait(self.hold_after)
            else:
                self._release.wait(300)
            conn.rollback()

    def release(self) -> None:
        self._release.set()


def lookup_pipeline(name: str, table: str) -> Pipeline:
    return Pipeline(
        name=name,
        source=FileSource(schema={"id": "string", "n": "int64", "user_id": "int64"}),
        steps=[Lookup(f"public.{table}", on={"user_id": "id"}, columns=["country"], timeout="1s")],
        sink=ParquetSink(name),
    )


@pytest.mark.parametrize("hold_after", [2.5, None], ids=["once", "always"])
def test_a_locked_lookup_table_loses_nothing(
    make_settings: Any, users_table: str, db_url: str, hold_after: float | None
) -> None:
    """Lookups time out after 1 s while an ACCESS EXCLUSIVE lock holds their table: for a
    while (the stage restarts and completes) or past every stage attempt (the run fails;
    once the lock is gone a rerun completes exactly)."""
    settings: TestSettings = make_settings(
        read_block_bytes=16_384, checkpoint_interval_seconds=0.2, lookup_retries=0
    )
    platform = open_platform(settings)
    name = f"alock_{secrets.token_hex(3)}"
    lock = TableLock(db_url, users_table, hold_after)
    try:
        expected = write_landing(settings, name)
        pipeline = lookup_pipeline(name, users_table)
        discover(platform, discovery_of(pipeline, settings))
        lock.start()
        assert lock.locked.wait(30)
        if hold_after is not None:
            run_pipeline(settings, pipeline)
        else:
            with pytest.raises(
                RunFailed, match=r"the Spark job failed after \d+ stage attempts: .*Timeout"
            ):
                run_pipeline(settings, pipeline)
            assert_no_loss_so_far(output_ids(pipeline, settings), expected)
            lock.release()
            lock.join(30)
            run_pipeline(settings, pipeline)
        assert lock.waited.is_set()  # a lookup really waited on the lock
        assert_exact(output_ids(pipeline, settings), expected)
    finally:
        lock.release()
        lock.join(30)
        platform.close()


def assert_no_loss_so_far(found: Counter[str], expected: set[str]) -> None:
    assert not [i for i, c in found.items() if c > 1]
    assert set(found) <= expected
