"""Event time through real runs (local Spark, real Postgres): watermark markers flow through
an event-time unordered pipeline to the sink, every checkpoint snapshot carries the
sink-side watermark, and a SIGKILLed worker's splits resume their committed watermarks.

What a subtask's snapshot says — ``snapshot["watermark"]`` W at checkpoint n — is checked
against what its sink committed: every record of its splits with event time <= W is in
output that subtask committed with a checkpoint <= n (a watermark never reaches the sink
before the records it bounds).
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from conftest import TestSettings
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from spark_workers import python_workers

from enumerator_service._operations import Platform, discover, open_platform
from spark_jobs import AsyncMap, CoroutineAsyncFunction, FileSource, Map, ParquetSink, Pipeline
from spark_jobs._spark import spark_for
from spark_jobs.jobs import RunSummary, run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

T0 = datetime(2026, 2, 1, tzinfo=UTC)
LINES = 300
RUN_LIMIT = 120.0
OUT_OF_ORDERNESS = timedelta(seconds=1)


class Scrambled(CoroutineAsyncFunction[dict[str, Any], dict[str, Any]]):
    """Completes each record after a random few milliseconds: completion order != input
    order, so the unordered step really reorders between watermarks."""

    async def invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        await asyncio.sleep(random.uniform(0.01, 0.03))
        return [{"tag": value["id"].upper()}]


def unchanged(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def unordered_pipeline(name: str) -> Pipeline:
    return Pipeline(
        name=name,
        source=FileSource(
            schema={"id": "string", "at": "timestamp", "qty": "int32"},
            required=["id", "at"],
            event_time="at",
            out_of_orderness=OUT_OF_ORDERNESS,
        ),
        steps=[
            Map(unchanged),
            AsyncMap(Scrambled(), output={"tag": "string"}, capacity=4, mode="unordered"),
        ],
        sink=ParquetSink(f"{name}_out"),
        key=["id"],
    )


def land_two_speeds(settings: TestSettings, name: str) -> dict[str, dict[str, datetime]]:
    """Two files of one day whose event time advances at different speeds (10 s and 1 s per
    record), each in order: file name → {record id: event time}."""
    folder = settings.data_path / "landing" / name / "dt=2026-02-01"
    folder.mkdir(parents=True)
    files: dict[str, dict[str, datetime]] = {}
    for label, step in (("fast", 10), ("slow", 1)):
        times = {f"{label}{i:04d}": T0 + timedelta(seconds=step * i) for i in range(LINES)}
        lines = [
            orjson.dumps({"id": key, "at": at.isoformat(), "qty": 1}) + b"\n"
            for key, at in times.items()
        ]
        path = folder / f"{label}.jsonl"
        path.write_bytes(b"".join(lines))
        files[path.name] = times
    return files


def completed_acks(platform: Platform, source: str) -> list[dict[str, Any]]:
    """Acknowledgements of the completed checkpoints of ``source``'s runs, in order."""
    query = sa.text(
        "SELECT a.run_id, a.checkpoint_id, a.subtask, a.attempt, a.snapshot"
        " FROM sluice.checkpoint_acks a JOIN sluice.checkpoints c USING (run_id, checkpoint_id)"
        " WHERE c.source = :source AND c.status = 'COMPLETED'"
        " ORDER BY a.run_id, a.checkpoint_id, a.subtask"
    )
    with platform.engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(query, {"source": source})]


def committed_ids(platform: Platform, run_id: str) -> dict[tuple[int, int], set[str]]:
    """(subtask, checkpoint) → the record ids its committed sink transaction wrote."""
    query = sa.text(
        "SELECT subtask, checkpoint_id, staged FROM sluice.sink_transactions"
        " WHERE run_id = :run AND committed"
    )
    out: dict[tuple[int, int], set[str]] = defaultdict(set)
    with platform.engine.connect() as conn:
        for subtask, checkpoint_id, staged in conn.execute(query, {"run": run_id}):
            for entry in staged:
                ids = pq.read_table(entry["final"], columns=["id"]).column("id").to_pylist()
                out[(subtask, checkpoint_id)].update(ids)
    return out


def _parse(mark: str | None) -> datetime | None:
    return None if mark is None else datetime.fromisoformat(mark)


def test_watermarks_reach_the_sink_after_the_records_they_bound(make_settings: Any) -> None:
    settings: TestSettings = make_settings(
        parallelism=2,
        read_block_bytes=1024,
        checkpoint_interval_seconds=0.1,
        target_split_bytes=1 << 20,  # one split per file
    )
    platform = open_platform(settings)
    name = f"evt_{secrets.token_hex(3)}"
    try:
        files = land_two_speeds(settings, name)
        pipeline = unordered_pipeline(name)
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        assert summary.rows_out == 2 * LINES
        with platform.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, uri FROM sluice.splits")).all()
        names = {int(split_id): Path(uri).name for split_id, uri in rows}
        acks = completed_acks(platform, name)
        committed = committed_ids(platform, summary.run_id)
        by_subtask: dict[int, list[dict[str, Any]]] = defaultdict(list)
        checked_marks = 0
        for ack in acks:
            by_subtask[ack["subtask"]].append(ack)
        for subtask, own in by_subtask.items():
            marks = [_parse(a["snapshot"]["watermark"]) for a in own]
            finished = [a["snapshot"]["finished"] for a in own]
            assert finished[-1] is True and not any(finished[:-1]), (subtask, finished)
            assert own[-1]["snapshot"]["idle"] is True  # no split left, nothing in flight
            first = next((i for i, m in enumerate(marks) if m is not None), len(marks))
            known = marks[first:]
            assert None not in known and known == sorted(known), (subtask, marks)
            # The records of the splits this subtask read, by event time.
            held = [[s["id"] for s in a["snapshot"]["splits"]] for a in own]
            read = {split_id for ids in held for split_id in ids}
            if not read:
                continue  # the other subtask took both files
            # Its last marker: the newest split watermark it reached (each split's last
            # advance is offered when the split finishes).
            newest = max(max(files[names[i]].values()) for i in read) - OUT_OF_ORDERNESS
            assert marks[-1] == newest, (subtask, marks[-1], newest)
            # The split it read first began before any marker: each of its records with an
            # event time <= W entered the chain before W, so it was committed with W. (A
            # split begun later may hold records behind W: late, like a file landing late.)
            started = next(ids for ids in held if ids)
            if len(started) != 1:
                continue
            times = files[names[started[0]]]
            written: set[str] = set()
            for ack, mark in zip(own, marks, strict=True):
                written |= committed.get((subtask, ack["checkpoint_id"]), set())
                if mark is None:
                    continue
                bounded = {k for k, t in times.items() if t <= mark}
                assert bounded <= written, (
                    f"subtask {subtask}, checkpoint {ack['checkpoint_id']}: watermark {mark} "
                    f"at the sink before {sorted(bounded - written)[:5]}"
                )
                checked_marks += 1
        assert checked_marks, "no snapshot carried a watermark"
    finally:
        platform.close()


# -- restore after a SIGKILL -------------------------------------------------------------


def _split_marks(platform: Platform, source: str) -> dict[int, datetime]:
    with platform.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT id, committed_watermark FROM sluice.splits"
                " WHERE source = :s AND committed_watermark IS NOT NULL"
            ),
            {"s": source},
        ).all()
    return {int(row[0]): row[1] for row in rows}


def test_watermarks_never_move_back_after_a_sigkilled_worker(make_settings: Any) -> None:
    # Few, slow blocks (one lookup of 200 ms at a time) and frequent checkpoints: after the
    # restart, checkpoints are taken while the restored splits still re-read their ranges in
    # flight, before any new block could raise their watermarks again.
    settings: TestSettings = make_settings(
        demo_events=6_000,
        demo_users=5_000,
        target_split_bytes=64 << 10,
        read_block_bytes=16 << 10,
        lookup_capacity=1,
        lookup_injected_latency_ms=200,
        checkpoint_interval_seconds=0.1,
        checkpoint_timeout_seconds=10,
        lease_seconds=5,
    )
    platform = open_platform(settings)
    spark = spark_for(settings)
    out: list[Any] = []
    thread = threading.Thread()
    try:
        prepare_demo(settings, platform)
        total = demo_discover(platform).splits_registered

        def run() -> None:
            try:
                out.append(run_pipeline(settings, demo_pipeline(settings)))
            except BaseException as exc:
                out.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        # Kill a Python worker once a checkpoint committed split watermarks mid-split and a
        # subtask's sink-side watermark.
        killed, at_kill = None, {}
        deadline = time.monotonic() + RUN_LIMIT
        while killed is None and thread.is_alive() and time.monotonic() < deadline:
            with platform.engine.connect() as conn:
                reading = conn.execute(
                    sa.text(
                        "SELECT count(*) FROM sluice.splits WHERE source = :s"
                        " AND status = 'READING' AND committed_watermark IS NOT NULL"
                    ),
                    {"s": settings.source_name},
                ).scalar_one()
            marked = any(
                a["snapshot"]["watermark"] is not None
                for a in completed_acks(platform, settings.source_name)
            )
            workers = python_workers()
            if reading and marked and len(workers) >= 2:
                at_kill = _split_marks(platform, settings.source_name)
                killed = workers[0].pid
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        thread.join(RUN_LIMIT)
        assert not thread.is_alive(), "the run hangs"
        assert killed is not None, "the run ended before a kill"
        (summary,) = out
        assert isinstance(summary, RunSummary), summary
        assert summary.splits == total
        # Committed split watermarks, checkpoint after checkpoint (both attempts): never back,
        # never forgotten (a restored split starts from its committed watermark).
        history: dict[int, list[tuple[int, str, datetime | None]]] = defaultdict(list)
        for ack in completed_acks(platform, settings.source_name):
            for state in ack["snapshot"]["splits"]:
                history[state["id"]].append(
                    (ack["checkpoint_id"], ack["attempt"], _parse(state["watermark"]))
                )
        attempts = {attempt for states in history.values() for _, attempt, _ in states}
        assert len(attempts) > 2, "no subtask was restored"
        for split_id, states in history.items():
            marks = [mark for _, _, mark in sorted(states, key=lambda s: s[0])]
            first = next((i for i, m in enumerate(marks) if m is not None), len(marks))
            assert None not in marks[first:], f"split {split_id} forgot its watermark: {states}"
            known = marks[first:]
            assert known == sorted(known), f"split {split_id} moved back: {states}"
        # The same for each subtask's sink-side watermark: a retried attempt resumes it.
        tasks: dict[int, list[datetime | None]] = defaultdict(list)
        for ack in completed_acks(platform, settings.source_name):
            tasks[ack["subtask"]].append(_parse(ack["snapshot"]["watermark"]))
        for subtask, marks in tasks.items():
            first = next((i for i, m in enumerate(marks) if m is not None), len(marks))
            assert None not in marks[first:], f"subtask {subtask} forgot its watermark: {marks}"
            assert marks[first:] == sorted(marks[first:]), f"subtask {subtask}: {marks}"
        final = _split_marks(platform, settings.source_name)
        for split_id, mark in at_kill.items():
            assert final[split_id] >= mark, (split_id, mark, final[split_id])
    finally:
        if thread.is_alive():
            spark.sparkContext.cancelAllJobs()
            thread.join(30)
        platform.close()
