"""Partition completeness on a real Postgres: the run watermark of each completed checkpoint,
the output partitions (event days) it completes, recorded in the checkpoint's own
transaction, once; late records dead-lettered or reopening their partition.

Subtasks are played by the test through the same ``acknowledge()`` the reader tasks use, with
snapshots shaped as the watermark part makes them (``watermark``: ISO-8601 UTC or null,
``finished``); the store's ``complete`` is called directly, as the coordinator does.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from enumerator_service import (
    Acknowledgement,
    CheckpointStore,
    FileSplit,
    Settings,
    SplitAssignment,
    SplitStore,
    StagedTransaction,
    acknowledge,
)
from enumerator_service._checkpoint_store import apply_split_states, encode_dead_letters
from enumerator_service._completeness import (
    END_OF_INPUT,
    NO_WATERMARK,
    add_partition_counts,
    complete_partitions,
    completed_partitions,
)
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import (
    checkpoints,
    partition_completions,
    partition_stats,
    run_watermarks,
)

D1, D2 = date(2026, 1, 1), date(2026, 1, 2)


class NullSink:
    name = "null"

    def commit(self, conn: Any, txns: Any) -> None:
        pass

    def publish(self, txns: list[StagedTransaction]) -> None:
        pass

    def abort(self, txns: list[StagedTransaction]) -> None:
        pass


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    settings: Settings = make_settings()
    p = open_platform(settings)
    yield p
    p.close()


class Run:
    """A run of the test's source holding one split per subtask (pulled in order)."""

    def __init__(self, platform: Platform, days: list[date]) -> None:
        self.platform = platform
        self.source = platform.settings.source_name
        self.run_id = f"run-{secrets.token_hex(4)}"
        store = SplitStore(platform.engine)
        register(platform, days, self.run_id)
        store.assign_to_run(self.run_id, self.source, lease_seconds=60)
        held = [store.pull_next(self.run_id, k, 60) for k in range(len(days))]
        assert all(a is not None for a in held)
        self.held: list[SplitAssignment] = [a for a in held if a is not None]
        self.store = CheckpointStore(
            platform.engine, self.run_id, {"null": NullSink()}, source=self.source
        )
        self.next_id = 1

    def checkpoint(
        self,
        subtasks: Mapping[int, tuple[str | None, bool]],
        partitions: Mapping[int, Mapping[str, Mapping[str, int]]] | None = None,
        dead: Mapping[int, list[tuple[int, int, bytes, str]]] | None = None,
        *,
        two_phase: bool = True,
    ) -> Any:
        """Checkpoint n acknowledged by ``subtasks`` (subtask → (watermark, finished)), then
        completed; returns the CompletedCheckpoint."""
        n = self.next_id
        self.next_id += 1
        self.store.trigger(n)
        for subtask, (watermark, finished) in subtasks.items():
            self.ack(
                n,
                subtask,
                watermark,
                finished,
                (partitions or {}).get(subtask),
                (dead or {}).get(subtask, []),
                two_phase=two_phase,
            )
        return self.store.complete(n, two_phase=two_phase)

    def ack(
        self,
        n: int,
        subtask: int,
        watermark: str | None,
        finished: bool,
        partitions: Mapping[str, Mapping[str, int]] | None,
        dead: list[tuple[int, int, bytes, str]],
        *,
        two_phase: bool = True,
    ) -> None:
        split = self.held[subtask]
        state = {
            "id": split.split_id,
            "epoch": split.epoch,
            "offset": 1000 if finished else 100,
            "watermark": watermark,
            "finished": finished,
            "pending": [],
        }
        rows = sum(c.get("rows", 0) for c in (partitions or {}).values())
        acknowledge(
            self.platform.engine,
            Acknowledgement(
                run_id=self.run_id,
                checkpoint_id=n,
                subtask=subtask,
                attempt="a1",
                final=finished,
                snapshot={"splits": [state], "watermark": watermark, "finished": finished},
                sink="null",
                staged=[{"batch": f"{subtask}-{n}"}] if rows else [],
                row_count=rows,
                dead_letters=encode_dead_letters(dead),
                source=self.source,
                partitions=partitions,
            ),
            two_phase=two_phase,
        )


def register(platform: Platform, days: list[date], prefix: str) -> None:
    SplitStore(platform.engine).register(
        FileSplit(
            platform.settings.source_name,
            "jsonl",
            f"/landing/dt={day}/{prefix}-{i}.jsonl",
            0,
            1000,
            day,
        )
        for i, day in enumerate(days)
    )


def completions(platform: Platform) -> list[Any]:
    with platform.engine.connect() as conn:
        return conn.execute(
            sa.select(partition_completions)
            .where(partition_completions.c.source == platform.settings.source_name)
            .order_by(partition_completions.c.partition_key, partition_completions.c.generation)
        ).all()


def stats(platform: Platform, day: date) -> Any:
    with platform.engine.connect() as conn:
        return conn.execute(
            sa.select(partition_stats).where(
                partition_stats.c.source == platform.settings.source_name,
                partition_stats.c.partition_key == day,
            )
        ).one()


def run_watermark_row(platform: Platform, run_id: str) -> Any:
    with platform.engine.connect() as conn:
        return conn.execute(
            sa.select(run_watermarks).where(run_watermarks.c.run_id == run_id)
        ).one()


def at(day: int, hour: int) -> str:
    """A snapshot watermark: 2026-01-<day> <hour>:00 UTC, ISO-8601."""
    return datetime(2026, 1, day, hour, tzinfo=UTC).isoformat()


def rows(n: int, dead: int = 0, late: int = 0) -> dict[str, int]:
    return {"rows": n, "dead_letters": dead, "late_records": late}


def test_a_bounded_run_completes_each_day_once_when_its_watermark_and_splits_allow(
    platform: Platform,
) -> None:
    run = Run(platform, [D1, D1, D2])
    # 1: subtask 1 has no watermark yet: the run's is -infinity, nothing completes.
    done = run.checkpoint(
        {0: (at(1, 12), False), 1: (None, False), 2: (at(2, 5), False)},
        partitions={0: {"2026-01-01": rows(5)}, 2: {"2026-01-02": rows(7)}},
    )
    assert (done.watermark, done.completions) == (NO_WATERMARK, ())
    live = run_watermark_row(platform, run.run_id)
    assert (live.checkpoint_id, live.watermark, live.finished) == (1, None, False)
    # 2: the run watermark passes the end of D1, but subtask 1 still reads a D1 split.
    done = run.checkpoint(
        {0: (at(1, 12), True), 1: (at(2, 1), False), 2: (at(2, 6), False)},
        partitions={1: {"2026-01-01": rows(3, dead=1)}},
    )
    assert done.watermark == datetime(2026, 1, 2, 1, tzinfo=UTC)
    assert done.completions == ()
    assert completions(platform) == []
    # 3: every D1 split is committed and the watermark is past D1's end: D1 completes.
    done = run.checkpoint(
        {1: ("2026-01-02T01:00:00+00:00", True), 2: ("2026-01-02T07:00:00+00:00", False)},
        partitions={2: {"2026-01-02": rows(1)}},
    )
    assert [c.partition_key for c in done.completions] == [D1]
    (d1,) = completions(platform)
    assert (d1.partition_key, d1.generation, d1.run_id, d1.checkpoint_id) == (D1, 1, run.run_id, 3)
    assert d1.watermark == datetime(2026, 1, 2, 7, tzinfo=UTC)
    assert (d1.rows, d1.dead_letters, d1.late_records, d1.reported_at) == (8, 1, 0, None)
    # 4: the last subtask's input ends: +infinity completes D2 (watermark NULL = end of input).
    done = run.checkpoint({2: ("2026-01-02T07:00:00+00:00", True)})
    assert done.watermark == END_OF_INPUT
    d1_again, d2 = completions(platform)
    assert d1_again == d1  # completed once
    assert (d2.partition_key, d2.generation, d2.watermark, d2.rows) == (D2, 1, None, 8)
    live = run_watermark_row(platform, run.run_id)
    # +infinity is ``finished``; the watermark column keeps the last finite run watermark.
    assert (live.checkpoint_id, live.finished) == (4, True)
    assert live.watermark == datetime(2026, 1, 2, 7, tzinfo=UTC)
    # Completing the same checkpoint again is a no-op.
    assert run.store.complete(4, two_phase=True) is None
    assert len(completions(platform)) == 2
    with platform.engine.connect() as conn:
        assert completed_partitions(conn, run.source) == {D1, D2}


def test_a_day_waits_for_its_splits_in_other_runs_and_the_pool(platform: Platform) -> None:
    run = Run(platform, [D1])
    register(platform, [D1], "later")  # a D1 file discovered after the run took its splits
    done = run.checkpoint(
        {0: ("2026-01-01T23:00:00+00:00", True)}, partitions={0: {"2026-01-01": rows(4)}}
    )
    assert done.watermark == END_OF_INPUT and done.completions == ()
    # The next run reads that file to the end: its checkpoint completes D1, with all counts.
    second = Run(platform, [])
    second.held = _pull(platform, second.run_id, 1)
    done = second.checkpoint(
        {0: ("2026-01-01T23:30:00+00:00", True)}, partitions={0: {"2026-01-01": rows(2)}}
    )
    assert [(c.partition_key, c.run_id, c.rows) for c in done.completions] == [
        (D1, second.run_id, 6)
    ]


def _pull(platform: Platform, run_id: str, subtasks: int) -> list[SplitAssignment]:
    store = SplitStore(platform.engine)
    store.assign_to_run(run_id, platform.settings.source_name, lease_seconds=60)
    held = [store.pull_next(run_id, k, 60) for k in range(subtasks)]
    return [a for a in held if a is not None]


def test_a_completion_commits_with_its_checkpoint_or_not_at_all(platform: Platform) -> None:
    run = Run(platform, [D1])
    function = f"sluice.fail_{secrets.token_hex(4)}"
    trigger = f"fail_{secrets.token_hex(4)}"
    with platform.engine.begin() as conn:
        # The checkpoint's last statement (PENDING -> COMPLETED) fails, after the completion
        # was inserted in the same transaction.
        conn.execute(
            sa.text(
                f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'injected commit failure'; END $$"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE TRIGGER {trigger} BEFORE UPDATE ON sluice.checkpoints FOR EACH ROW "
                f"WHEN (NEW.status = 'COMPLETED' AND NEW.run_id = '{run.run_id}') "
                f"EXECUTE FUNCTION {function}()"
            )
        )
    try:
        with pytest.raises(sa.exc.DBAPIError, match="injected commit failure"):
            run.checkpoint(
                {0: ("2026-01-02T00:00:00+00:00", True)}, partitions={0: {"2026-01-01": rows(9)}}
            )
        assert completions(platform) == []
        with platform.engine.connect() as conn:
            assert (
                conn.execute(
                    sa.select(checkpoints.c.status).where(checkpoints.c.run_id == run.run_id)
                ).scalar_one()
                == "PENDING"
            )
            assert (
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(partition_stats)
                    .where(partition_stats.c.source == run.source)
                ).scalar_one()
                == 0
            )
            assert (
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(run_watermarks)
                    .where(run_watermarks.c.run_id == run.run_id)
                ).scalar_one()
                == 0
            )
    finally:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TRIGGER {trigger} ON sluice.checkpoints"))
            conn.execute(sa.text(f"DROP FUNCTION {function}()"))
    # The retried completion of the same checkpoint records it exactly once.
    done = run.store.complete(1, two_phase=True)
    assert done is not None and [c.rows for c in done.completions] == [9]
    assert [(c.partition_key, c.generation) for c in completions(platform)] == [(D1, 1)]


def test_a_late_dead_letter_does_not_reopen_its_day_and_late_rows_make_generation_2(
    platform: Platform,
) -> None:
    run = Run(platform, [D1, D2])
    done = run.checkpoint(
        {0: ("2026-01-02T00:00:00+00:00", True), 1: ("2026-01-02T03:00:00+00:00", False)},
        partitions={0: {"2026-01-01": rows(4)}},
    )
    assert [c.partition_key for c in done.completions] == [D1]
    # Policy dead_letter: a D1 record read after D1 completed is a dead letter (reason late).
    late = [(run.held[1].split_id, 40, b'{"ts": "2026-01-01T10:00:00Z"}', "late")]
    done = run.checkpoint(
        {1: ("2026-01-02T04:00:00+00:00", False)},
        partitions={1: {"2026-01-01": rows(0, dead=1, late=1)}},
        dead={1: late},
    )
    assert done.completions == ()
    counted = stats(platform, D1)
    assert (counted.dead_letters, counted.late_records, counted.open) == (1, 1, False)
    # Policy reopen: late rows are written to D1, which completes again as generation 2 (at
    # once: the run watermark is already past its end).
    done = run.checkpoint(
        {1: ("2026-01-02T05:00:00+00:00", False)},
        partitions={1: {"2026-01-01": rows(2, late=2), "2026-01-02": rows(6)}},
    )
    assert [(c.partition_key, c.generation) for c in done.completions] == [(D1, 2)]
    recorded = [
        (c.partition_key, c.generation, c.rows, c.late_records) for c in completions(platform)
    ]
    assert recorded == [(D1, 1, 4, 0), (D1, 2, 6, 3)]
    with platform.engine.connect() as conn:
        reasons = conn.execute(
            sa.text("SELECT reason FROM sluice.dead_letters WHERE run_id = :r"),
            {"r": run.run_id},
        ).scalars()
        assert list(reasons) == ["late"]


def test_at_least_once_counts_each_acknowledgement_once(platform: Platform) -> None:
    run = Run(platform, [D1])
    run.store.trigger(1)
    run.next_id = 2
    for _ in range(2):  # a repeated acknowledgement (retried write) counts once
        run.ack(1, 0, "2026-01-01T10:00:00+00:00", False, {"2026-01-01": rows(3)}, [],
                two_phase=False)  # fmt: skip
    run.store.complete(1, two_phase=False)
    assert stats(platform, D1).rows == 3
    done = run.checkpoint({0: ("2026-01-01T10:00:00+00:00", True)}, two_phase=False)
    assert [(c.partition_key, c.rows) for c in done.completions] == [(D1, 3)]


def test_two_runs_finishing_one_day_concurrently_record_it_exactly_once(
    platform: Platform,
) -> None:
    first = Run(platform, [D1])
    register(platform, [D1], "second")
    second = Run(platform, [])
    second.held = _pull(platform, second.run_id, 1)
    split = first.held[0]
    state = {
        "id": split.split_id,
        "epoch": split.epoch,
        "offset": 1000,
        "watermark": None,
        "finished": True,
        "pending": [],
    }
    outcome: list[Any] = []
    with platform.engine.connect() as conn, conn.begin():
        # The first run's completion transaction, held open after its completion check: it
        # finished its D1 split but sees the second run's still READING.
        apply_split_states(conn, first.run_id, [state], skip_fenced=False)
        add_partition_counts(conn, first.source, {"2026-01-01": rows(3)})
        assert (
            complete_partitions(
                conn,
                source=first.source,
                run_id=first.run_id,
                checkpoint_id=1,
                watermark=END_OF_INPUT,
            )
            == []
        )
        worker = threading.Thread(
            target=lambda: outcome.append(
                second.checkpoint({0: (at(1, 23), True)}, partitions={0: {"2026-01-01": rows(4)}})
            )
        )
        worker.start()
        # The second run's completion waits for the first one's lock on the source …
        _wait_for_advisory_lock_waiter(platform)
    # … and, once the first committed, sees both D1 splits committed: D1 completes once.
    worker.join(timeout=30)
    (done,) = outcome
    assert [(c.partition_key, c.run_id, c.rows) for c in done.completions] == [
        (D1, second.run_id, 7)
    ]
    assert [(c.partition_key, c.generation) for c in completions(platform)] == [(D1, 1)]


def _wait_for_advisory_lock_waiter(platform: Platform, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    with platform.engine.connect() as conn:
        while not conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        ).scalar_one():
            if time.monotonic() > deadline:
                raise AssertionError("the second completion never waited for the lock")
            time.sleep(0.02)
            conn.rollback()
