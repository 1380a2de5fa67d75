"""Checkpoint bookkeeping stays bounded (real Postgres; the first test also real Spark).

A run deletes its checkpoints older than its last two completed ones (and than
``SLUICE_CHECKPOINT_HISTORY_SECONDS``) as checkpoints complete, keeping what the readers
still need: pending checkpoints, each subtask's latest committed acknowledgement (a
finished subtask's final one) and its latest one carrying a sink watermark. A run over for
``SLUICE_BOOKKEEPING_RETENTION_HOURS`` loses its bookkeeping at a later run's start.
"""

from __future__ import annotations

import secrets
import time
from datetime import date, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings
from demo_platform import demo_discover, demo_pipeline, prepare_demo

from enumerator_service import (
    AbortCause,
    Acknowledgement,
    CheckpointStore,
    FileSplit,
    SplitStore,
    acknowledge,
    committed_task_watermark,
)
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import checkpoint_acks, checkpoints, run_watermarks, splits
from spark_jobs import FileSource, Pipeline
from spark_jobs.jobs import run_pipeline


def _rows(platform: Platform, run_id: str) -> tuple[int, int]:
    """(checkpoint rows, acknowledgement rows) of ``run_id``."""
    with platform.engine.connect() as conn:
        return (
            conn.execute(
                sa.select(sa.func.count()).where(checkpoints.c.run_id == run_id)
            ).scalar_one(),
            conn.execute(
                sa.select(sa.func.count()).where(checkpoint_acks.c.run_id == run_id)
            ).scalar_one(),
        )


@pytest.mark.spark
def test_a_run_with_many_checkpoints_keeps_a_bounded_number_of_rows(make_settings: Any) -> None:
    # 60,000 events in blocks of 4 KiB and a 50 ms interval: a run of seconds with dozens of
    # checkpoints (old code: every one of them left in the tables). 20,000 gave 17-19 on a
    # quiet machine but 7 on a loaded one (slower checkpoints), fewer than the test needs.
    settings: TestSettings = make_settings(
        demo_events=60_000,
        demo_days=1,
        demo_files_per_day=2,
        read_block_bytes=4 << 10,
        checkpoint_interval_seconds=0.05,
        checkpoint_history_seconds=0,
    )
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        demo_discover(platform)
        summary = run_pipeline(settings, demo_pipeline(settings))
        assert summary.rows_out + summary.dead_letters + summary.dropped == 60_000
        assert summary.checkpoints >= 8, summary.checkpoints  # more than the bound below
        checkpoint_rows, ack_rows = _rows(platform, summary.run_id)
        print(
            f"{summary.checkpoints} checkpoints (p50 {summary.checkpoint_p50_ms:.0f} ms): "
            f"{checkpoint_rows} / {ack_rows} rows left"
        )
        subtasks = settings.parallelism
        # The last two completed and what each subtask's latest acknowledgements need.
        assert checkpoint_rows <= 2 + 2 * subtasks, checkpoint_rows
        assert ack_rows <= 2 * subtasks + 2 * subtasks, ack_rows
    finally:
        platform.close()


class _Run:
    """A run of two subtasks played by the test, each holding one split."""

    def __init__(self, platform: Platform, history_seconds: float | None) -> None:
        self.platform = platform
        self.run_id = f"run-{secrets.token_hex(4)}"
        source = platform.settings.source_name
        store = SplitStore(platform.engine)
        store.register(
            FileSplit(source, "jsonl", f"/l/{self.run_id}-{i}.jsonl", 0, 1000, date(2026, 1, 1))
            for i in range(2)
        )
        store.assign_to_run(self.run_id, source, lease_seconds=60)
        self.held = [store.pull_next(self.run_id, k, 60) for k in range(2)]
        self.store = CheckpointStore(
            platform.engine, self.run_id, {}, source=source, history_seconds=history_seconds
        )

    def checkpoint(self, n: int, marks: dict[int, str | None], *, final: int | None = None) -> None:
        """Checkpoint ``n`` acknowledged by the subtasks of ``marks`` (their sink watermarks),
        completed."""
        self.store.trigger(n)
        for subtask, mark in marks.items():
            split = self.held[subtask]
            assert split is not None
            done = subtask == final
            state = {
                "id": split.split_id,
                "epoch": split.epoch,
                "offset": 10 * n,
                "watermark": None,
                "finished": done,
                "pending": [],
            }
            acknowledge(
                self.platform.engine,
                Acknowledgement(
                    run_id=self.run_id,
                    checkpoint_id=n,
                    subtask=subtask,
                    attempt="a1",
                    final=done,
                    snapshot={"splits": [state], "watermark": mark, "finished": done},
                    sink="none",
                    staged=[],
                    row_count=0,
                    dead_letters=[],
                ),
                two_phase=True,
            )
        assert self.store.complete(n, two_phase=True) is not None


W1, W2 = "2026-01-01T01:00:00+00:00", "2026-01-01T02:00:00+00:00"


def _left(platform: Platform, run_id: str) -> tuple[dict[int, str], set[tuple[int, int]]]:
    """({checkpoint id: status}, {(checkpoint id, subtask) acknowledged}) of ``run_id``."""
    with platform.engine.connect() as conn:
        rows = conn.execute(
            sa.select(checkpoints.c.checkpoint_id, checkpoints.c.status).where(
                checkpoints.c.run_id == run_id
            )
        ).all()
        acks = conn.execute(
            sa.select(checkpoint_acks.c.checkpoint_id, checkpoint_acks.c.subtask).where(
                checkpoint_acks.c.run_id == run_id
            )
        ).all()
    return {int(n): str(s) for n, s in rows}, {(int(n), int(k)) for n, k in acks}


def _play(run: _Run) -> None:
    """Subtask 1 finishes at checkpoint 3 (sink watermark W1); checkpoint 4 is aborted;
    subtask 0 goes on alone to 30, its sink watermark W2 at 5-9 only (none later: the
    reader must then find the one at 9); checkpoint 31 stays pending."""
    for n in range(1, 4):
        run.checkpoint(n, {0: None, 1: W1}, final=1 if n == 3 else None)
    run.store.trigger(4)
    run.store.abort(4, AbortCause.TIMEOUT)
    for n in range(5, 31):
        run.checkpoint(n, {0: W2 if n < 10 else None})
    run.store.trigger(31)
    run.store.prune_ended()  # what the coordinator does when the run ends


def test_pruning_keeps_what_restore_and_the_readers_need(make_settings: Any) -> None:
    platform = open_platform(make_settings())
    try:
        run = _Run(platform, history_seconds=0)
        _play(run)
        left, acks = _left(platform, run.run_id)
        assert left == {3: "COMPLETED", 9: "COMPLETED", 29: "COMPLETED", 30: "COMPLETED"} | {
            31: "PENDING"
        }
        assert acks == {(3, 1), (9, 0), (29, 0), (30, 0)}
        # What a retried attempt reads: subtask 1 is done, each sink watermark resumes.
        assert run.store.finished(1) and not run.store.finished(0)
        engine = platform.engine
        assert committed_task_watermark(engine, run.run_id, 1) == datetime.fromisoformat(W1)
        assert committed_task_watermark(engine, run.run_id, 0) == datetime.fromisoformat(W2)
        # Within the history window nothing goes.
        recent = _Run(platform, history_seconds=3600)
        _play(recent)
        assert _rows(platform, recent.run_id) == (31, 2 * 3 + 26)
    finally:
        platform.close()


def _old_run(
    conn: sa.Connection, run_id: str, source: str, hours_ago: float, *, holding: bool = False
) -> None:
    """Checkpoints 1-3 of ``run_id``, completed ``hours_ago`` (one acknowledgement each), its
    run watermark, and (``holding``) a split it still reads."""
    at = sa.text(f"now() - interval '{float(hours_ago)} hours'")
    for n in range(1, 4):
        conn.execute(
            sa.insert(checkpoints).values(
                run_id=run_id,
                checkpoint_id=n,
                source=source,
                status="COMPLETED",
                triggered_at=at,
                completed_at=at,
            )
        )
        conn.execute(
            sa.insert(checkpoint_acks).values(
                run_id=run_id, checkpoint_id=n, subtask=0, attempt="a", snapshot={"splits": []}
            )
        )
    conn.execute(
        sa.insert(run_watermarks).values(
            run_id=run_id, source=source, checkpoint_id=3, updated_at=at
        )
    )
    if holding:
        conn.execute(
            sa.insert(splits).values(
                source=f"other_{secrets.token_hex(3)}",
                kind="jsonl",
                uri=f"/l/{run_id}.jsonl",
                status="READING",
                run_id=run_id,
                subtask=0,
                lease_expires_at=sa.text("now() + interval '1 hour'"),
            )
        )


def test_a_finished_run_past_the_retention_is_pruned_at_the_next_start(
    make_settings: Any,
) -> None:
    settings: TestSettings = make_settings(bookkeeping_retention_hours=24 * 7)
    platform = open_platform(settings)
    source = settings.source_name
    runs = {name: f"{name}-{secrets.token_hex(3)}" for name in ("old", "held", "recent")}
    try:
        with platform.engine.begin() as conn:
            _old_run(conn, runs["old"], source, 24 * 8)
            _old_run(conn, runs["held"], source, 24 * 8, holding=True)  # still alive
            _old_run(conn, runs["recent"], source, 1)
        before = {name: _rows(platform, run) for name, run in runs.items()}
        pipeline = Pipeline(name=source, source=FileSource(schema={"x": "int64"}))
        started = time.monotonic()
        assert run_pipeline(settings, pipeline).splits == 0  # a start with nothing to do
        after = {name: _rows(platform, run) for name, run in runs.items()}
        print(f"rows before {before}, after {after} ({time.monotonic() - started:.2f} s)")
        assert after == {"old": (0, 0), "held": (3, 3), "recent": (3, 3)}
        with platform.engine.connect() as conn:
            marks = set(
                conn.execute(
                    sa.select(run_watermarks.c.run_id).where(
                        run_watermarks.c.run_id.in_(runs.values())
                    )
                ).scalars()
            )
        assert marks == {runs["held"], runs["recent"]}
    finally:
        platform.close()
