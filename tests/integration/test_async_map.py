"""AsyncMap steps through the pipeline API on real Spark: a callback-style ``AsyncFunction``
per record with a retry on empty results and its own ``timeout()`` fallback, then a plain
``async def`` per batch — Flink's operator semantics per step, the output exact."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings

from enumerator_service._operations import discover, open_platform
from spark_jobs import (
    EMPTY_RESULT,
    AsyncFunction,
    AsyncMap,
    FileSource,
    ParquetSink,
    Pipeline,
    ResultFuture,
    fixed_delay,
)
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

RECORDS = 120


class Tag(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Callback style. Records with an odd ``n`` complete empty on their first call (retried,
    FLIP-234 style); records with ``n % 25 == 0`` never complete (their timeout answers);
    the others complete at once, from a callback on the loop."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def async_invoke(
        self, value: dict[str, Any], result_future: ResultFuture[dict[str, Any]]
    ) -> None:
        call = self.calls[value["id"]] = self.calls.get(value["id"], 0) + 1
        n = value["n"]
        if n % 25 == 0:
            return  # never completed: the timeout decides
        results = [] if n % 2 and call == 1 else [{"tag": f"t{n}", "attempt": call}]
        asyncio.get_running_loop().call_soon(result_future.complete, results)

    def timeout(self, value: dict[str, Any], result_future: ResultFuture[dict[str, Any]]) -> None:
        result_future.complete([{"tag": "timed out", "attempt": self.calls[value["id"]]}])


async def double(batch: pa.RecordBatch) -> pa.RecordBatch:
    await asyncio.sleep(0.001)
    return pa.RecordBatch.from_arrays([pc.multiply(batch.column("n"), 2)], names=["twice"])


def _land(settings: TestSettings, name: str) -> None:
    """``RECORDS`` records ``{"id": "r0001", "n": 1}`` … in one file of 2026-03-01."""
    folder = settings.data_path / "landing" / name / "dt=2026-03-01"
    folder.mkdir(parents=True)
    lines = [orjson.dumps({"id": f"r{n:04d}", "n": n}) + b"\n" for n in range(1, RECORDS + 1)]
    (folder / "a.jsonl").write_bytes(b"".join(lines))


def test_callback_and_coroutine_async_maps_per_record_and_per_batch(make_settings: Any) -> None:
    settings: TestSettings = make_settings(read_block_bytes=1024)
    platform = open_platform(settings)
    name = f"amap_{secrets.token_hex(3)}"
    try:
        _land(settings, name)
        pipeline = Pipeline(
            name=name,
            source=FileSource(schema={"id": "string", "n": "int64"}, required=["id", "n"]),
            steps=[
                AsyncMap(
                    Tag(),
                    output={"tag": "string", "attempt": "int32"},
                    per="record",
                    capacity=10,
                    timeout="2s",
                    retry=fixed_delay(2, 0.05, on_result=EMPTY_RESULT),
                    mode="unordered",
                ),
                AsyncMap(double, output={"twice": "int64"}, per="batch", mode="ordered"),
            ],
            sink=ParquetSink(name),
        )
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        rows = ds.dataset(output_path(pipeline, settings), format="parquet", partitioning="hive")
        found = {r["id"]: r for r in rows.to_table().to_pylist()}
        assert summary.rows_out == len(found) == RECORDS
        for n in range(1, RECORDS + 1):
            row = found[f"r{n:04d}"]
            if n % 25 == 0:  # never completed: answered by timeout() after the first call
                assert (row["tag"], row["attempt"], row["twice"]) == ("timed out", 1, 2 * n)
            else:
                expected = (f"t{n}", 2 if n % 2 else 1)
                assert (row["tag"], row["attempt"], row["twice"]) == (*expected, 2 * n)
    finally:
        platform.close()


class LastDone(AsyncFunction[dict[str, Any], dict[str, Any]]):
    """Answers, for a change (row, version), which version of its row had completed when it
    was called; later changes answer sooner (a delay falling with the position), so without
    key order a row's later change would be called, and complete, before its earlier one."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}

    def async_invoke(
        self, value: dict[str, Any], result_future: ResultFuture[dict[str, Any]]
    ) -> None:
        row, version, position = value["row"], value["version"], value["position"]
        seen = self.done.get(row)

        def finish() -> None:
            self.done[row] = version
            result_future.complete([{"seen": seen}])

        asyncio.get_running_loop().call_later(0.002 * (CHANGES - position) / CHANGES, finish)


CHANGES = 90


def test_key_mode_calls_a_rows_changes_in_order_on_spark(make_settings: Any) -> None:
    """Changes of 9 rows, 10 versions each, interleaved; per record and per batch in key mode
    on ``row``: each change is called only once the previous version of its row completed,
    every change comes out exactly once."""
    settings: TestSettings = make_settings(read_block_bytes=1024)  # a few blocks
    platform = open_platform(settings)
    name = f"amap_key_{secrets.token_hex(3)}"
    try:
        folder = settings.data_path / "landing" / name / "dt=2026-03-01"
        folder.mkdir(parents=True)
        changes = [(f"r{p % 9}", p // 9 + 1) for p in range(CHANGES)]
        lines = [
            orjson.dumps({"row": row, "version": version, "position": p}) + b"\n"
            for p, (row, version) in enumerate(changes)
        ]
        (folder / "a.jsonl").write_bytes(b"".join(lines))
        schema = {"row": "string", "version": "int64", "position": "int64"}
        pipeline = Pipeline(
            name=name,
            source=FileSource(schema=schema, required=["row", "version", "position"]),
            steps=[
                AsyncMap(
                    LastDone(),
                    output={"seen": "int64"},
                    capacity=20,
                    timeout="5s",
                    mode="key",
                    key="row",
                ),
                AsyncMap(
                    double_version, output={"twice": "int64"}, per="batch", mode="key", key="row"
                ),
            ],
            sink=ParquetSink(name),
        )
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        rows = ds.dataset(output_path(pipeline, settings), format="parquet", partitioning="hive")
        found = [
            (r["row"], r["version"], r["seen"], r["twice"]) for r in rows.to_table().to_pylist()
        ]
        assert summary.rows_out == len(found) == CHANGES
        assert len({(row, version) for row, version, _, _ in found}) == CHANGES  # no duplicate
        expected = {(row, version, None if version == 1 else version - 1, 2 * version)
                    for row, version in changes}  # fmt: skip
        assert set(found) == expected
    finally:
        platform.close()


async def double_version(batch: pa.RecordBatch) -> pa.RecordBatch:
    await asyncio.sleep(0.001)
    return pa.RecordBatch.from_arrays([pc.multiply(batch.column("version"), 2)], names=["twice"])


async def shrink(record: dict[str, Any]) -> dict[str, Any]:
    """``small`` out of the int16 range for every 40th record."""
    return {"small": 70_000 if record["n"] % 40 == 0 else record["n"]}


def test_a_per_record_result_that_does_not_fit_is_a_dead_letter_naming_its_field(
    make_settings: Any,
) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    name = f"amap_{secrets.token_hex(3)}"
    try:
        _land(settings, name)
        pipeline = Pipeline(
            name=name,
            source=FileSource(schema={"id": "string", "n": "int64"}, required=["id", "n"]),
            steps=[AsyncMap(shrink, output={"small": "int16"}, name="shrink")],
            sink=ParquetSink(name),
        )
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        assert summary.rows_out == RECORDS - RECORDS // 40
        with platform.engine.connect() as conn:
            dead = conn.execute(
                sa.text(
                    "SELECT reason, raw FROM sluice.dead_letters WHERE source = :s ORDER BY id"
                ),
                {"s": name},
            ).all()
        assert len(dead) == RECORDS // 40
        for reason, raw in dead:
            assert reason.startswith(
                "bad value: step 1 (AsyncMap shrink): field 'small': 70000 does not fit int16 ("
            ), reason
            # The record as it reached the step, with the function's result.
            record = orjson.loads(bytes(raw))
            assert record["small"] == 70_000 and record["n"] % 40 == 0
            assert record["id"] == f"r{record['n']:04d}"
    finally:
        platform.close()
