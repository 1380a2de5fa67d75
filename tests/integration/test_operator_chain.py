"""Flink's operator-chain scenario through the pipeline API, on real Spark and Postgres: an
ordered Lookup → a Map → an unordered per-record AsyncMap, one mailbox thread per task.

The restore test crashes the task (its Python worker exits) right after a checkpoint
completed with elements in flight in BOTH async steps — blocks waiting for their lookup and
records waiting for the async function — and Spark's retry restores from it: every record
reaches the output exactly once (duplicates 0, missing 0), equal to an oracle computed in
SQL over the same input.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings

from enumerator_service import asyncpg_dsn
from enumerator_service._operations import Platform, discover, open_platform
from examples._clickstream_data import load_users
from spark_jobs import (
    AsyncMap,
    CoroutineAsyncFunction,
    FileSource,
    Lookup,
    Map,
    ParquetSink,
    Pipeline,
)
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

USERS = 40
LINES = 300


def label(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``label`` = the user's name (or ``?``) and the quantity."""
    name = pc.fill_null(batch.column("user_name"), "?")
    qty = pc.cast(batch.column("qty"), pa.string())
    return batch.append_column("label", pc.binary_join_element_wise(name, qty, "-"))


class Tagger(CoroutineAsyncFunction[dict[str, Any], dict[str, Any]]):
    """``tag`` = ``<id>:<2 * qty>``, completed after a random short delay (a scrambled
    completion order). With ``crash_after`` (a marker file not yet there), it never completes
    anything: it waits for a completed checkpoint of its pipeline holding in-flight records
    of both async steps, writes that snapshot to the marker file and kills its worker."""

    def __init__(self, pipeline: str, dsn: str, crash_after: str | None = None) -> None:
        self.pipeline, self.dsn, self.crash_after = pipeline, dsn, crash_after
        self._holding = False
        self._watch: asyncio.Task[None] | None = None

    async def open(self) -> None:
        marker = self.crash_after
        self._holding = marker is not None and not Path(marker).exists()
        if self._holding:
            self._watch = asyncio.get_running_loop().create_task(self._crash_when_both())

    async def invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        if self._holding:
            await asyncio.Event().wait()  # held until the worker dies
        await asyncio.sleep(random.random() / 200)
        return [{"tag": f"{value['id']}:{2 * value['qty']}"}]

    async def _crash_when_both(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        while True:
            rows = await conn.fetch(
                "SELECT a.snapshot FROM sluice.checkpoint_acks a JOIN sluice.checkpoints c"
                " USING (run_id, checkpoint_id) WHERE c.source = $1 AND c.status = 'COMPLETED'",
                self.pipeline,
            )
            for row in rows:
                snapshot = json.loads(row["snapshot"])
                pending = [e for s in snapshot["splits"] for e in s["pending"]]
                if any("only" in e for e in pending) and any("only" not in e for e in pending):
                    assert self.crash_after is not None
                    Path(self.crash_after).write_text(json.dumps(pending))
                    os._exit(7)  # the worker dies: Spark retries the task
            await asyncio.sleep(0.05)


def chain(name: str, tagger: Tagger) -> Pipeline:
    return Pipeline(
        name=name,
        source=FileSource(
            schema={"id": "string", "user": "int64", "at": "timestamp", "qty": "int32"},
            required=["id", "user", "at", "qty"],
            event_time="at",
        ),
        steps=[
            Lookup(
                "public.users",
                on={"user": "id"},
                columns={"name": "user_name", "country": "country"},
                mode="ordered",
            ),
            Map(label),
            AsyncMap(tagger, output={"tag": "string"}, capacity=8, mode="unordered"),
        ],
        sink=ParquetSink(f"{name}_out"),
        key=["id"],
    )


def land(settings: TestSettings, name: str) -> list[dict[str, Any]]:
    folder = settings.data_path / "landing" / name / "dt=2026-02-01"
    folder.mkdir(parents=True)
    rng = random.Random(5)
    records = [
        {
            "id": f"c{i:05d}",
            "user": rng.randint(1, USERS + 5),  # some users do not exist
            "at": f"2026-02-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00",
            "qty": rng.randint(1, 9),
        }
        for i in range(LINES)
    ]
    (folder / "part-0.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return records


def oracle(platform: Platform, records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    with platform.engine.begin() as conn:
        conn.execute(sa.text("CREATE TEMP TABLE landed (id text, uid bigint, qty int)"))
        conn.execute(
            sa.text("INSERT INTO landed VALUES (:id, :user, :qty)"),
            [{"id": r["id"], "user": r["user"], "qty": r["qty"]} for r in records],
        )
        return [
            tuple(row)
            for row in conn.execute(
                sa.text(
                    "SELECT l.id, u.name, u.country, COALESCE(u.name, '?') || '-' || l.qty,"
                    " l.id || ':' || (2 * l.qty) FROM landed l"
                    " LEFT JOIN public.users u ON u.id = l.uid ORDER BY l.id"
                )
            ).all()
        ]


def output(settings: TestSettings, pipeline: Pipeline) -> list[tuple[Any, ...]]:
    table = ds.dataset(output_path(pipeline, settings), format="parquet", partitioning="hive")
    rows = table.to_table().to_pylist()
    return sorted((r["id"], r["user_name"], r["country"], r["label"], r["tag"]) for r in rows)


def _prepared(make_settings: Any, **overrides: Any) -> tuple[TestSettings, Platform, str]:
    settings: TestSettings = make_settings(**overrides)
    platform = open_platform(settings)
    load_users(
        asyncpg_dsn(platform.url), schema="public", table="users", key="id", users=USERS, seed=3
    )
    return settings, platform, f"chain_{secrets.token_hex(3)}"


def test_ordered_lookup_then_map_then_unordered_async_step(make_settings: Any) -> None:
    settings, platform, name = _prepared(make_settings, read_block_bytes=2048)
    try:
        records = land(settings, name)
        pipeline = chain(name, Tagger(name, asyncpg_dsn(platform.url)))
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        assert summary.rows_out == LINES
        assert [s[0] for s in summary.steps] == [
            "step 1 (Lookup public.users)",
            "step 2 (Map label)",
            "step 3 (AsyncMap Tagger)",
        ]
        assert all(
            records_in == records_out == LINES for _, records_in, records_out in summary.steps
        )
        assert output(settings, pipeline) == oracle(platform, records)
    finally:
        platform.close()


def test_a_restore_with_elements_in_flight_in_both_async_steps(
    make_settings: Any, tmp_path: Path
) -> None:
    # One subtask, small blocks, one slow connection: while the first block's records wait
    # for the async function, the next blocks wait for their lookups.
    settings, platform, name = _prepared(
        make_settings,
        parallelism=1,
        read_block_bytes=1024,
        checkpoint_interval_seconds=0.3,
        lookup_injected_latency_ms=400,
        lookup_pool_size=1,
        lookup_capacity=4,
    )
    marker = tmp_path / "crashed.json"
    try:
        records = land(settings, name)
        pipeline = chain(name, Tagger(name, asyncpg_dsn(platform.url), str(marker)))
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        crashed_at = json.loads(marker.read_text())  # the first attempt died
        assert any("only" in e for e in crashed_at), "records of the async function in flight"
        assert any("only" not in e for e in crashed_at), "blocks of the lookup in flight"
        rows = output(settings, pipeline)
        ids = [r[0] for r in rows]
        duplicates, missing = len(ids) - len(set(ids)), len({r["id"] for r in records} - set(ids))
        assert (duplicates, missing) == (0, 0)
        assert rows == oracle(platform, records)
        assert summary.rows_out == LINES
    finally:
        platform.close()
